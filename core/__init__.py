"""The agreements every package shares, written once.

The balancer, the error hierarchy, job and rank states, the rank environment,
config defaults, the YAML field readers and the re-plan rule. Everything here
needs only the standard library and PyYAML: no torch, grpc, protobuf or
SQLAlchemy (a layering test pins it), so the agent, the coordinator, the
trainer and the TUI can all import it.
"""
