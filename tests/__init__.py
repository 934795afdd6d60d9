"""Test suite of nodeagent."""
