"""The network layer, as Kafka's: the socket server and its acceptor, the request log, and this
broker's own connections to other brokers.
"""
