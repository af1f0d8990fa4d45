"""The node agent: hardware profile, telemetry, worker supervision."""
