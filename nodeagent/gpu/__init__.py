"""Typed read/write API over NVML: the only package that calls ``pynvml``."""
