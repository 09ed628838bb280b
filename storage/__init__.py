"""Bytes at rest: the local log (segments, indexes, checkpoints) and, later, the remote tier."""
