"""The server: network, replication, controller, coordinators, handlers and config, each
in a folder named as Kafka names it; `cli` holds the command line, clients of a broker."""
