"""Cluster metadata: topics, partitions, leaders, and the controller that changes them."""
