"""SASL authentication of a listener's connections (Kafka's SaslServerAuthenticator) and of
this broker to the others: PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER."""
