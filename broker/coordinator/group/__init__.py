"""The classic consumer-group coordinator and the `__consumer_offsets` topic."""
