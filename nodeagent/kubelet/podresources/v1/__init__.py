"""Pod-resources API v1, client side (``api_pb2`` and ``api_pb2_grpc`` are generated)."""
