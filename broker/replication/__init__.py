"""Replication, as Kafka's ReplicaManager and Partition: leaders and followers, the ISR and
high watermark, follower fetching, purgatories, and the replica a consumer reads from
(KIP-392).
"""
