"""Rank worker: join the process group as hetero's ranks do, then rank 0 exits 3 if the
rendezvous store listens on any address but the loopback (``MASTER_ADDR`` is
``127.0.0.1`` for a one-host launch). Reads the listening sockets of ``MASTER_PORT``
from ``/proc/net/tcp`` and ``/proc/net/tcp6``.

Usage: rendezvous.py
"""

from __future__ import annotations

import ipaddress
import os
import sys
from datetime import timedelta
from pathlib import Path

LISTEN = "0A"


def listening(port: int) -> list[str]:
    """The local addresses that listen on TCP ``port``, as text."""
    found = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                # Each 32-bit word is in host (little-endian) order.
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.append(str(ipaddress.ip_address(raw)))
    return found


def main() -> int:
    import torch.distributed as dist

    from hetero.trainer import procgroup

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    procgroup.join("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    code = 0
    if rank == 0:
        addresses = listening(int(os.environ["MASTER_PORT"]))
        print(f"rendezvous store listens on {addresses}", file=sys.stderr)
        if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
            code = 3
    dist.barrier()
    procgroup.leave()
    return code


if __name__ == "__main__":
    sys.exit(main())
