"""``hetero-top``'s command line: the cluster view, a run directory's view, or either in
a browser.

- ``hetero-top [--coordinator ADDR]``: the live cluster and its jobs (``app.HeteroTop``);
- ``hetero-top --run DIR``: a standalone run, from its output directory (``runapp.RunTop``);
- ``--web HOST:PORT`` serves the chosen view to browsers (``web``) instead of
  drawing it in this terminal.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hetero.core import defaults
from hetero.core.errors import HeteroError
from hetero.security.auth import load_token
from hetero.security.transport import add_client_arguments, client_security_from_args, is_loopback


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hetero-top",
        description="Live terminal UI of a hetero cluster and its jobs, or of one run's "
        "output directory; --web serves it to browsers.",
    )
    p.add_argument(
        "--coordinator",
        default=os.environ.get("HETERO_COORDINATOR", defaults.COORDINATOR_ADDRESS),
        help="coordinator host:port (default $HETERO_COORDINATOR, else "
        f"{defaults.COORDINATOR_ADDRESS})",
    )
    p.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="follow a hetero-train or ht.init run's output directory instead (no coordinator)",
    )
    p.add_argument("--period", type=float, default=1.0, help="seconds between updates (default 1)")
    web = p.add_argument_group("browser (see docs/tui.md#in-a-browser)")
    web.add_argument(
        "--web",
        metavar="HOST:PORT",
        help="serve the view to browsers at http://HOST:PORT/ instead of this terminal; an "
        "address other than loopback needs the token (--token-file, $HETERO_TOKEN_FILE or "
        "$HETERO_TOKEN), which browsers present once as /?token=TOKEN",
    )
    web.add_argument(
        "--insecure",
        action="store_true",
        help="serve --web beyond loopback without a token (a trusted network only)",
    )
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not 0.2 <= args.period <= 60:
        p.exit(2, "error: hetero-top: --period must be between 0.2 and 60 seconds\n")
    try:
        if args.web:
            return _serve_web(args)
        if args.run is not None:
            return _run_view(args)
        return _cluster_view(args)
    except HeteroError as exc:
        print(f"error: hetero-top: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run_view(args: argparse.Namespace) -> int:
    from hetero.tui.runapp import RunTop

    app = RunTop(args.run, period_s=args.period)
    app.run()
    return app.return_code or 0


def _cluster_view(args: argparse.Namespace) -> int:
    from hetero.tui.app import HeteroTop

    security = client_security_from_args(args)
    app = HeteroTop(args.coordinator, period_s=args.period, security=security)
    app.client.check_access()  # a refused token is one line, before the view draws
    app.run()
    if app.fatal is not None:
        print(f"error: hetero-top: {app.fatal}", file=sys.stderr)
        return app.fatal.exit_code
    return app.return_code or 0


def view_command(args: argparse.Namespace) -> list[str]:
    """The ``hetero-top`` each browser tab runs: this one's view and credentials by path
    (never a token in argv), without ``--web``."""
    cmd = [sys.executable, "-m", "hetero.tui.cli", "--period", str(args.period)]
    if args.run is not None:
        cmd += ["--run", str(args.run.resolve())]
    else:
        cmd += ["--coordinator", args.coordinator]
    for flag in ("token_file", "tls_ca", "tls_cert", "tls_key"):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(Path(value).resolve())]
    return cmd


def _serve_web(args: argparse.Namespace) -> int:
    from hetero.tui.web import WebView, check_web_listen, serve, split_address

    host, port = split_address(args.web)
    token = load_token(args.token_file)
    check_web_listen(args.web, token, args.insecure)
    if not is_loopback(args.web) and token is not None:
        print(
            "hetero-top: the web view speaks plain HTTP: the token crosses the network in "
            "clear unless a TLS proxy or an SSH tunnel carries it",
            file=sys.stderr,
        )
    if args.run is None:
        client_security_from_args(args)  # a bad credential fails here, not in each tab
    what = f"run {args.run}" if args.run is not None else f"coordinator {args.coordinator}"
    view = WebView(
        shlex.join(view_command(args)), host, port, token=token, title=f"hetero-top: {what}"
    )
    auth = "open this address once to sign in" + (
        ", or /?token=TOKEN with the token given" if token is not None else ""
    )
    serve(view, lambda url: print(f"hetero-top: web view of {what} at {url} ({auth})", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
