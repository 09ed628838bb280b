"""The Kafka wire protocol: framing, request/response codec and record batches.

Nothing here knows about logs, sockets or their owners; schema work is kio's.
"""
