"""The coordinator daemon: gRPC API, SQLite store, placement and the balancer."""
