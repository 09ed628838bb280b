"""ACLs and the authorizer that decides with them, as Kafka's StandardAuthorizer / AclAuthorizer."""
