"""The ``nodeagent`` command line: one module per command group, thin over library code."""
