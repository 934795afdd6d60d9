"""Tests of the tiering service."""
