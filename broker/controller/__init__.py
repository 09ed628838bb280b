"""The controller, as Kafka's ZooKeeper-mode one: the broker that elects leaders, with its
partition state machine, reassignments and elections.
"""
