"""Defaults that more than one package relies on, written once.

The coordinator's config and flags, its servicer and sweeper, the agent, the
local cluster of ``make demo`` and the trainer all read these names; none
restates a value. Units are in the names (``_s`` seconds).
"""

from __future__ import annotations

import os
from pathlib import Path

# ---- addresses and files --------------------------------------------------------------------

#: Where the coordinator listens and its clients (agents, ``hetero-coord``, ``hetero-top``) dial.
COORDINATOR_ADDRESS = "127.0.0.1:7070"
#: Where an agent serves ``AgentLocal`` to its own ranks.
AGENT_LOCAL_ADDRESS = "127.0.0.1:7071"
COORDINATOR_CONFIG_PATH = Path("/etc/hetero/coordinator.yaml")
AGENT_CONFIG_PATH = Path("/etc/hetero/agent.yaml")
#: Log formats both daemons accept.
LOG_FORMATS = ("text", "json")


def default_state_dir() -> Path:
    """``$HETERO_STATE_DIR`` if set, else ``/var/lib/hetero`` for root and
    ``~/.local/state/hetero`` (XDG) otherwise."""
    chosen = os.environ.get("HETERO_STATE_DIR")
    if chosen:
        return Path(chosen)
    if os.geteuid() == 0:
        return Path("/var/lib/hetero")
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "hetero"


# ---- node health ----------------------------------------------------------------------------

#: Seconds between an agent's heartbeats; the coordinator tells agents at registration.
HEARTBEAT_INTERVAL_S = 2.0
#: A node silent this long is down and its jobs restart. Must exceed the interval.
HEARTBEAT_TIMEOUT_S = 10.0
#: Seconds a stopping coordinator lets calls in flight finish.
SHUTDOWN_GRACE_S = 5.0

# ---- rendezvous -----------------------------------------------------------------------------

#: First rendezvous port (MASTER_PORT) handed to jobs; each job and restart takes the next...
MASTER_PORT_BASE = 29500
#: ...within this many ports, then wraps around.
MASTER_PORT_SPAN = 1000

# ---- collectives ----------------------------------------------------------------------------

#: Seconds a collective may wait for a peer in a job the coordinator runs (job.yaml's
#: ``collective_timeout_s``): a rank stuck on a dead peer ends with an error within
#: this bound instead of hanging, and the job restarts.
JOB_COLLECTIVE_TIMEOUT_S = 60.0
#: Seconds a collective waits for a peer outside an agent (torch's own default).
COLLECTIVE_TIMEOUT_S = 600.0

# ---- balancing ------------------------------------------------------------------------------

#: Steps between re-plans for job.yaml, ``hetero-train`` and ``ht.init`` alike
#: (``hetero.core.catalogue``).
REBALANCE_INTERVAL_STEPS = 10
