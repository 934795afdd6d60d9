"""The agent process: components composed in one process, supervised, with signals and sd_notify."""
