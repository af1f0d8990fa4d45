"""Model-zoo workloads: a user's loop through the API and the same loop in plain DDP."""
