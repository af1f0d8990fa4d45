"""A throwaway one-host Slurm cluster for the ``slurm`` tests: Debian's ``slurm-wlm`` and
``munge``, a fresh munge key, a short ``slurm.conf``, ``munged``, ``slurmctld`` and
``slurmd`` started by hand, everything under one temporary directory, stopped and deleted
at the end. Nothing under /etc is read or written: every command gets the configuration
through ``SLURM_CONF`` and talks to this munged through ``AuthInfo=socket=...``.

The daemons run as root (``SlurmUser=root``), so the cluster needs root. With
``HETERO_SLURM_INSTALL=1`` (``make test-slurm``) a root process installs the two packages
with apt-get when they are missing. The node claims more CPUs than the host has
(``SlurmdParameters=config_overrides``): the tests run 3 tasks on a 2-core host, each a
CPU rank that shares the cores, as ``hetero-train --nproc 3`` does.

``python tests/integration/slurmcluster.py`` starts a cluster, runs ``srun -n2 hostname``
and stops it: it prints why not in one line (exit 1) where no cluster can run here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Seconds allowed for apt-get (update and install) and for the node to come up.
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 60
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
#: CPUs the node claims (3 CPU ranks and some headroom on a 2-core host).
NODE_CPUS = 8


class Unavailable(Exception):
    """No Slurm cluster can run here; the message says why, in one line."""


def _missing() -> list[str]:
    return [d for d in (*DAEMONS, "srun") if shutil.which(d, path=_PATH) is None]


#: Debian puts the daemons in /usr/sbin, which a user's PATH may lack.
_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])


def _install() -> None:
    if os.environ.get("HETERO_SLURM_INSTALL") != "1":
        raise Unavailable(
            f"Slurm not installed ({', '.join(_missing())} not found; "
            "make test-slurm installs slurm-wlm and munge)"
        )
    if shutil.which("apt-get") is None:
        raise Unavailable("Slurm not installed, and apt-get (Debian) is not here")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    for cmd in (["apt-get", "update", "-qq"], install):
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{' '.join(cmd)} took over {INSTALL_TIMEOUT_S} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"{' '.join(cmd)} failed: {last}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """One node (this host, under its short hostname) in one partition, ``debug``.

    ``env()`` is the environment every Slurm command of the tests runs with
    (``SLURM_CONF`` and the daemons' directory on ``PATH``)."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise Unavailable("a throwaway Slurm cluster needs root (its daemons run as root)")
        if _missing():
            _install()
            if _missing():
                raise Unavailable(f"{', '.join(_missing())} not found after installing Slurm")
        self.root = Path(tempfile.mkdtemp(prefix="hetero-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": _PATH, **extra}

    def _start(self) -> None:
        os.chmod(self.root, 0o700)  # munged refuses a key or socket in a directory others can write
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = self.root / "munge.sock"
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        self.conf.write_text(self._config(sock))
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--log-file={self.root / 'munged.log'}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--seed-file={self.root / 'munged.seed'}",
        )
        self._wait_for(sock.exists, "munged did not create its socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        self._wait_for(self._node_idle, f"node {self.node} did not become idle")

    def _config(self, munge_socket: Path) -> str:
        r = self.root
        return "\n".join(
            [
                "ClusterName=hetero-test",
                f"SlurmctldHost={self.node}(127.0.0.1)",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                f"PlugStackConfig={r / 'plugstack.conf'}",
                f"StateSaveLocation={r / 'state'}",
                f"SlurmdSpoolDir={r / 'spool'}",
                f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                f"SlurmdPidFile={r / 'slurmd.pid'}",
                f"SlurmctldLogFile={r / 'slurmctld.log'}",
                f"SlurmdLogFile={r / 'slurmd.log'}",
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN",
                f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _spawn(self, daemon: str, *args: str) -> None:
        log = (self.root / f"{daemon}.out").open("wb")
        path = shutil.which(daemon, path=_PATH)
        assert path is not None
        self._procs[daemon] = subprocess.Popen(
            [path, *args],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _node_idle(self) -> bool:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True
        )
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def _wait_for(self, ready: object, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [n for n, p in self._procs.items() if p.poll() is not None]
            if dead:
                raise Unavailable(f"{dead[0]} exited: {self._last_log_line(dead[0])}")
            if ready():
                return
            time.sleep(0.2)
        raise Unavailable(f"{what} within {START_TIMEOUT_S} s")

    def _last_log_line(self, daemon: str) -> str:
        for name in (f"{daemon}.log", f"{daemon}.out"):
            path = self.root / name
            if path.exists():
                lines = path.read_text(errors="replace").strip().splitlines()
                if lines:
                    return lines[-1]
        return "no output"

    def stop(self) -> None:
        """Stop the daemons (slurmd, slurmctld, munged: the reverse of their start) and
        delete the directory."""
        for name in reversed(list(self._procs)):
            proc = self._procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    try:
        cluster = SlurmCluster()
    except Unavailable as exc:
        print(exc)
        sys.exit(1)
    try:
        done = subprocess.run(
            ["srun", "-n2", "hostname"],
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        print(done.stdout.strip() or done.stderr.strip())
        sys.exit(done.returncode)
    finally:
        cluster.stop()
