"""What the test suite and the benchmarks share (as ``kopf.testing`` does for kopf's users).

Nothing in the product imports this package.
"""
