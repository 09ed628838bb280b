"""Client quotas per user and client id, as Kafka's `ClientQuotaManager`s keep them."""
