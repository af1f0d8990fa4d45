"""Stopping on SIGTERM: every rank finishes the same step, then the job checkpoints and exits.

Schedulers (Slurm, Kubernetes, the hetero agent stopping a rank for a restart or a
cancel) send SIGTERM and mean "save and exit"; SIGKILL follows after a grace period
(the agent's ``stop_grace_s``, 10 s by default). A rank killed at once loses every
step since its last periodic checkpoint.

:class:`StopRequest` turns SIGTERM into a flag (the handler does nothing else: a
rank whose peers are dead sits in a collective and is SIGKILLed after the grace, as
before). A second SIGTERM restores the default action and re-raises it: who insists
gets the old behaviour, death with status 143.

A rank whose peers are dead is blocked in a collective, and a Python signal handler
runs only when the main thread returns to the interpreter. So that it does not live
on until the SIGKILL (slowing the restart of a failed job: the coordinator places the
job again once every old rank has stopped), a watcher thread wakes on the signal
(``signal.set_wakeup_fd``) and ends the process with status 143 if the ranks have
not agreed and no step has closed within three times the slowest of the recent
steps (at least :data:`STUCK_MIN_S`), unless it is writing a checkpoint. A healthy
rank closes a step within that and drains.

A checkpoint is collective, so the ranks must agree on the step at which to stop.
At a poll step every rank issues a non-blocking all-reduce (MAX) of its flag on a
Gloo group of its own and waits for the one it issued at the poll step before. That
one has had at least a whole step to complete: every rank issued it before it joined
the next step's gradient reduction, so the wait finds it done. All ranks read the
same result of the same collective at the same step, so they stop at the same step,
one or two polls after the signal. Issuing costs a Gloo enqueue, tenths of a
millisecond on a loaded CPU host (docs/trainer.md), so short steps are not all poll
steps: the ranks poll every ``k`` steps, ``k`` the steps in :data:`POLL_PERIOD_S` at
the slowest rank's pace of the last interval (at most :data:`MAX_EVERY`). Every rank
computes ``k`` from the same all-gathered summaries at the same boundary, so the
poll steps stay the same on all; a stop then waits at most two periods. The group is Gloo on CPU whatever the
job's backend: one int on the host, no GPU stream touched, no NCCL kernel queued.

Exit status 143 (128 + SIGTERM) is what schedulers, the local launcher and the
agent read as "terminated": the agent reports a rank it stopped as stopped whatever
its status, and the coordinator counts exits in RESTARTING or CANCELLED as
confirmations, never as failures.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hetero.core.errors import Stopped

if TYPE_CHECKING:
    from hetero.trainer.exchange import RankSummary

log = logging.getLogger("hetero.trainer")

#: The status of a process that stopped on SIGTERM: 128 + 15, as the shell reports one
#: killed by it.
EXIT_STATUS = Stopped.exit_code
#: Seconds without a closed step, after SIGTERM and before the ranks agree, after which
#: the rank counts as stuck (at least; else three times its slowest recent step).
STUCK_MIN_S = 2.0
#: Recent step durations the watcher's bound is taken from.
_RECENT_STEPS = 32
#: Seconds of steps between two polls (at least one step per poll).
POLL_PERIOD_S = 0.05
#: Most steps between two polls, whatever their pace.
MAX_EVERY = 100


class StopRequest:
    """SIGTERM as a flag, and each step's agreement of the ranks on it.

    Create it on every rank (collective: it makes a Gloo group when ``world_size > 1``);
    call :meth:`poll` once per step on every rank; :meth:`close` restores the previous
    handler and releases the group.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        #: This rank received SIGTERM (set by the handler, read on the step path).
        self.signalled = False
        #: The ranks agreed to stop at the step of the last :meth:`poll` that returned True.
        self.agreed = False
        #: Set while the rank writes a checkpoint: a long write is no stuck rank.
        self.busy = False
        self._group: Any = dist.new_group(backend="gloo") if world_size > 1 else None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None
        #: Steps between polls, the next poll step, and the boundaries the pace was set at.
        self.every = 1
        self._next_at = 0
        self._paced = 0
        self._previous: Any = None
        self._installed = threading.current_thread() is threading.main_thread()
        if not self._installed:  # signal handlers belong to the main thread
            log.warning("not on the main thread: SIGTERM stops this rank at once")
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        #: Seconds between recent polls, and when the last one was (monotonic s).
        self._steps_s: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._polled_at = time.monotonic()
        self._stepped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        #: Whether the wakeup fd is ours (not someone else's: an event loop keeps its own).
        self._waking = previous_fd == -1
        if self._waking:
            threading.Thread(target=self._watch, name="hetero-drain", daemon=True).start()
        else:
            signal.set_wakeup_fd(previous_fd)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled:  # a second one: the default action, now
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
            return
        self.signalled = True

    def _watch(self) -> None:
        """On the watcher thread: after SIGTERM, end the rank if it is stuck (module doc)."""
        with os.fdopen(self._wake_r, "rb", buffering=0) as wake:
            while True:
                woken = wake.read(64)
                if not woken:  # :meth:`close` closed the other end
                    return
                if signal.SIGTERM in woken:
                    break
            while not self.agreed:
                self._stepped.clear()
                limit_s = max(STUCK_MIN_S, 3 * max(self._steps_s, default=0.0))
                if not self._stepped.wait(limit_s) and not (self.agreed or self.busy):
                    os.write(2, b"no step closed after SIGTERM: stuck, stopping at once\n")
                    os._exit(EXIT_STATUS)
            return

    def pace(self, summaries: Sequence[Sequence[RankSummary]]) -> None:
        """At a boundary, on every rank alike: poll every :data:`POLL_PERIOD_S` of steps
        at the slowest rank's pace of the interval just exchanged (module doc)."""
        if len(summaries) == self._paced:
            return
        self._paced = len(summaries)
        step_s = max(s.step_s for s in summaries[-1])
        self.every = min(MAX_EVERY, max(1, int(POLL_PERIOD_S / step_s))) if step_s > 0 else 1

    def poll(self, step: int) -> bool:
        """Once per step (the global step just closed) on every rank: whether all ranks
        stop after this step. At a poll step, waits for the all-reduce issued at the
        poll step before (already done, module doc) and issues this one's; True once
        any rank's flag was up. Collective."""
        if self.agreed:
            return True
        if self._installed:
            now = time.monotonic()
            self._steps_s.append(now - self._polled_at)
            self._polled_at = now
            self._stepped.set()
        if step < self._next_at:
            return False
        self._next_at = step + self.every
        if self._group is None:
            self.agreed = self.signalled
            return self.agreed
        if self._work is not None:
            self._work.wait()
            self._work = None
            if int(self._flag.item()) > 0:
                self.agreed = True
                return True  # every rank saw it: none issues another
        self._flag.fill_(1 if self.signalled else 0)
        self._work = dist.all_reduce(
            self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return False

    def close(self, *, failed: bool = False) -> None:
        """Restore the handler from before; a SIGTERM the ranks did not act on is
        re-raised under it (the process ends as it would have without us). Drops the
        group, so that leaving the process group ends it (``trainer.procgroup``).

        ``failed``: this rank stops on an error; its peers may be gone, so the
        all-reduce in flight is not waited for (it would wait for the timeout)."""
        if self._work is not None and not failed:
            self._work.wait()  # every rank issued it at the same step: done or nearly
        self._work = None
        self._group = None
        if not self._installed:
            return
        self._installed = False
        if self._waking:
            signal.set_wakeup_fd(-1)
            os.close(self._wake_w)  # the watcher reads EOF and ends
        signal.signal(signal.SIGTERM, self._previous)
        if self.signalled and not self.agreed:
            signal.raise_signal(signal.SIGTERM)
