"""tierbroker: a Kafka-protocol broker in Python asyncio with tiered storage built in.

The installed package. Its layers live in the source tree's top-level folders
(`protocol/`, `storage/`, `rlm/`, `broker/`, `pipeline/`, `testing/`), which setup.py
maps into this package, so a user's environment gains one top-level name, `tierbroker`.
"""
