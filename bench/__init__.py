"""hetero-bench: benchmark harness and cluster simulator."""
