"""The command line, `tierbroker`: `main` runs the server (`serve`) and registers the
everyday commands against a running broker (`topic`, `produce`, `consume`, `group`,
`cluster`, `tier`, `demo`), one module per family, all through confluent-kafka
(librdkafka). Each imports the client library only when it runs, so `tierbroker serve`
starts without loading it; nothing of the server imports this package.
"""
