"""The agreements every package shares, written once.

The balancer, the error hierarchy, job and rank states, the rank environment,
config defaults, the YAML field readers, the re-plan rule, the catalogue of
models, datasets, policies and training options (``catalogue``, from which
``hetero-train``'s flags, job.yaml's keys and ``ht.train``'s keywords are
derived) and the job spec (``jobspec``); and the few edge helpers that more than
one package needs: NVML access that degrades to "n/a" (``nvml``, loading
``nvidia-ml-py`` on first use) and daemon logging (``logs``). Everything here
needs only the standard library and PyYAML: no torch, grpc, protobuf or
SQLAlchemy (a layering test pins it), so the agent, the coordinator, the
trainer and the TUI can all import it.
"""
