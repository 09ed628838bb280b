"""What an operator watches: the `/metrics` endpoint, and the meters and gauges it
reports under Apache Kafka's metric names."""
