"""Who a connection is and what it may do: TLS, SASL, principals and the authorizer."""
