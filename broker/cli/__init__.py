"""Everyday commands against a running broker (`topic`, `produce`, `consume`, `group`,
`cluster`), one module per family, all through confluent-kafka (librdkafka).

`broker.cli` registers them; each imports the client library only when it runs, so
`tierbroker serve` starts without loading it.
"""
