"""Broker configuration keyed by Apache Kafka's property names."""
