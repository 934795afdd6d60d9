"""GPU health: signals, the XID catalog, the per-GPU health model and the node stability score."""
