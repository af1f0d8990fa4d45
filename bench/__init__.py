"""hetero-bench: benchmark harness and cluster simulator, and what runs a whole cluster on
one machine: ``localcluster`` (a coordinator and agents as processes), ``demo`` (``make
demo``) and ``controlbench`` (the control plane's latency and overhead).

The local cluster lives here, at the top of the layering, because it starts daemons and
ranks of every package and drives them as a client; the agent and the coordinator it
starts import none of it (tests/unit/test_layering.py).
"""
