"""The server: network, handlers, replicas, cluster metadata, config and CLI."""
