"""DRA resource health v1alpha1 (``api_pb2`` and ``api_pb2_grpc`` are generated)."""
