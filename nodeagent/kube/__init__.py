"""A thin adapter over the official ``kubernetes`` client for patching this node."""
