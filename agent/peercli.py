"""``hetero-agent peer``: measure the link between two nodes on demand (``agent.peerprobe``).

On one node ``hetero-agent peer --serve`` opens an ephemeral port and prints the
line to run on the other (its address, port and a fresh token); the other runs
it and prints the round trip and both directions' bandwidth. The server answers
until interrupted. The token only lets a peer run this probe: it is printed,
not stored.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from dataclasses import asdict
from typing import Any

from hetero.agent.peerprobe import PeerLink, PeerProbeServer, measure_peer
from hetero.core.errors import ConfigError, UnreachableError
from hetero.core.peerlinks import TOKEN_BYTES


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    peer = sub.add_parser(
        "peer",
        help="measure the link to another node (round trip, bandwidth each way)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    peer.add_argument("target", nargs="?", metavar="HOST:PORT", help="the serving node")
    peer.add_argument("--token", help="the token the serving node printed (hex)")
    peer.add_argument("--serve", action="store_true", help="answer probes until interrupted")
    peer.add_argument("--listen", default="0.0.0.0", help="address to serve on (default all)")
    peer.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if args.serve:
        return _serve(args.listen)
    if not args.target or not args.token:
        raise ConfigError("peer: give HOST:PORT and --token, as `peer --serve` printed them")
    host, _, port = args.target.rpartition(":")
    try:
        token = bytes.fromhex(args.token)
        link = measure_peer(args.target, host, int(port), token)
    except ValueError:
        raise ConfigError(f"peer: {args.target!r} is not HOST:PORT or the token not hex") from None
    except OSError as exc:
        raise UnreachableError(f"cannot probe {args.target} ({exc})") from None
    print(json.dumps(asdict(link)) if args.json else describe(link))
    return 0


def describe(link: PeerLink) -> str:
    """One line: the round trip in ms and each direction in MB/s."""

    def mb(x: float | None) -> str:
        return f"{x / 1e6:.0f} MB/s" if x else "too fast to time"

    return (
        f"{link.peer}: rtt {link.rtt_s * 1e3:.3f} ms, send {mb(link.send_bytes_per_s)}, "
        f"receive {mb(link.receive_bytes_per_s)}"
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(listen: str) -> int:
    # SIGTERM ends it as Ctrl-C does: the port closed, exit 0.
    signal.signal(signal.SIGTERM, _interrupt)
    token = os.urandom(TOKEN_BYTES)
    with PeerProbeServer(token, listen) as server:
        host = listen if listen not in ("0.0.0.0", "::") else "THIS_HOST"
        print(f"hetero-agent peer {host}:{server.port} --token {token.hex()}", flush=True)
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            return 0
