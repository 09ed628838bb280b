"""Batch jobs over the remote tier, runnable with spark-submit or as functions (`export`)."""
