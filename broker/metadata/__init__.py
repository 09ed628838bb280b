"""Cluster metadata: the coordination store (ZooKeeper, or one in this process) with
Kafka's znode layout, this broker's cache of it, and the topic changes written to it."""
