"""The user commands of ``hetero-coord`` (submit, jobs, job, nodes, cancel, drain, logs,
export, health): thin gRPC clients of the coordinator, with no database library and
nothing of the coordinator's own modules (pyproject.toml's import contracts)."""
