"""``hetero-top --web HOST:PORT``: the same views in a browser, served by ``textual-serve``.

Each browser tab that connects gets its own ``hetero-top`` process (textual-serve's
model: the app runs with Textual's web driver and its screen streams over a
websocket), so the terminal UI and the web view are one program.

The listen rule is every hetero listener's (``hetero.security.transport.check_listen``):
loopback by default; any other address needs a token (``--token-file``,
``$HETERO_TOKEN_FILE`` or ``$HETERO_TOKEN``), or ``--insecure`` on a trusted
network; anything else is refused with one line.

**Every request must show who it is, on loopback too** (as Jupyter's): a
loopback port is open to every local user, and each tab acts with the
operator's credential (a plain websocket client cancelled another user's job).
At start the server makes a random URL token of its own, 256 bits, valid until
it stops, and prints its address with it (``/?token=...``); the token the view
was given, if any, signs in as well. A browser signs in once at
``/?token=TOKEN``: the server answers with a session cookie (HttpOnly,
SameSite=Strict; its value an HMAC under a key made at start, never a token) and
redirects to ``/`` so the token leaves the address bar; scripts may send
``Authorization: Bearer TOKEN`` instead. Two more checks: a loopback server
answers only requests whose ``Host`` is a loopback name, so a web page cannot
reach it by pointing its own domain at 127.0.0.1 (DNS rebinding), and the
websocket that drives the app must come from the page's own origin (no
cross-site websocket). At most :data:`MAX_SESSIONS` app processes run at once,
and a window is at most :data:`MAX_COLUMNS` by :data:`MAX_ROWS` cells, however
large a size the page asks for (an app drawing a 10^9-cell screen).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import signal
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server

from hetero.core.errors import ConfigError
from hetero.security.auth import SCHEME, Secret, new_token
from hetero.security.transport import is_loopback

COOKIE = "hetero_top_session"
#: App processes (browser tabs) served at once; more get 503.
MAX_SESSIONS = 8
#: The largest window a page may ask for, in cells; larger sizes are cut to these.
MAX_COLUMNS = 500
MAX_ROWS = 200
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WEB_FONT = re.compile(r"<link[^>]*fonts\.googleapis\.com[^>]*>", re.DOTALL)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); a one-line error otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--web {address}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host, int(port)


def check_web_listen(address: str, token: Secret | None, insecure: bool) -> None:
    """Refuse a non-loopback ``address`` without a token unless ``insecure``."""
    if is_loopback(address) or token is not None or insecure:
        return
    raise ConfigError(
        f"refusing to serve the web view on {address} without authentication: give a token "
        "(--token-file or $HETERO_TOKEN_FILE; browsers then open /?token=TOKEN once), bind "
        "it to loopback, or --insecure on a trusted network"
    )


def window_cells(asked: str | None, default: int, most: int) -> int:
    """A window dimension a page asked for, as cells within 1..``most`` (``default`` when
    it is no number)."""
    try:
        cells = int(str(asked))
    except ValueError:
        return default
    return min(max(cells, 1), most)


def _host_name(host_header: str) -> str:
    return (urlsplit(f"//{host_header}").hostname or "").lower()


class WebView(Server):  # type: ignore[misc, unused-ignore]
    """textual-serve's server with hetero's authentication and origin checks."""

    def __init__(
        self, command: str, host: str, port: int, *, token: Secret | None, title: str
    ) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.token = token
        #: The token of the address printed at start (module doc).
        self.url_token = new_token()
        self.loopback = is_loopback(f"{host}:{port}")
        self.sessions = 0
        key = secrets.token_bytes(32)
        self._session = hmac.new(key, b"hetero-top web session", hashlib.sha256).hexdigest()

    async def on_startup(self, app: web.Application) -> None:
        """Nothing: ``serve`` says where it listens, in one line (textual-serve prints a logo)."""

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    @web.middleware  # type: ignore[untyped-decorator, unused-ignore]
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.loopback and _host_name(request.host) not in _LOOPBACK_NAMES:
            raise web.HTTPForbidden(text="hetero-top: this server answers loopback names only\n")
        if not self._signed_in(request):
            presented = request.query.get("token", "")
            if request.path == "/" and self._accepts(presented):
                response = web.HTTPSeeOther("/")
                response.set_cookie(
                    COOKIE, self._session, httponly=True, samesite="Strict", path="/"
                )
                return response
            raise web.HTTPUnauthorized(
                text="hetero-top: sign in by opening the address hetero-top printed at start "
                "(/?token=...), or send Authorization: Bearer TOKEN\n"
            )
        if request.path == "/ws":
            return await self._websocket(request, handler)
        return await handler(request)

    def _accepts(self, presented: str) -> bool:
        """Whether ``presented`` is the URL token or the token the view was given."""
        given = self.token is not None and self.token.matches(presented)
        return bool(presented) and (self.url_token.matches(presented) or given)

    def _signed_in(self, request: web.Request) -> bool:
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self._session):
            return True
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        return scheme == SCHEME and self._accepts(presented.strip())

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's, with the window it starts the app in bounded (module doc)."""
        width = window_cells(request.query.get("width"), 80, MAX_COLUMNS)
        height = window_cells(request.query.get("height"), 24, MAX_ROWS)
        bounded = request.clone(rel_url=request.rel_url.update_query(width=width, height=height))
        response: web.WebSocketResponse = await super().handle_websocket(bounded)
        return response

    async def _process_messages(self, websocket: web.WebSocketResponse, app: Any) -> None:
        """textual-serve's, with every resize the page sends bounded (module doc)."""
        resize = app.set_terminal_size

        async def bounded(width: Any, height: Any) -> None:
            await resize(window_cells(width, 80, MAX_COLUMNS), window_cells(height, 24, MAX_ROWS))

        app.set_terminal_size = bounded
        await super()._process_messages(websocket, app)

    async def _websocket(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="hetero-top: websocket from another origin\n")
        if self.sessions >= MAX_SESSIONS:
            raise web.HTTPServiceUnavailable(text="hetero-top: too many open views\n")
        self.sessions += 1
        try:
            return await handler(request)
        finally:
            self.sessions -= 1

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        """textual-serve's page, with URLs of the address the browser used (a server bound to
        0.0.0.0 has no single public URL) and without its web-font link: the page loads
        nothing from outside the cluster."""
        base = f"{request.scheme}://{request.host}"
        ws = ("wss" if request.scheme == "https" else "ws") + f"://{request.host}/ws"
        context: dict[str, Any] = {
            "font_size": 16,
            "app_websocket_url": ws,
            "config": {"static": {"url": f"{base}/static/"}},
            "application": {"name": self.title},
        }
        response = aiohttp_jinja2.render_template("app_index.html", request, context)
        html = _WEB_FONT.sub("", response.text or "")
        return web.Response(text=html, content_type="text/html")


def serve(view: WebView, announce: Callable[[str], None]) -> None:
    """Serve until SIGINT or SIGTERM; ``announce`` gets the URL, with the URL token, once
    listening (port 0 becomes the port the system chose)."""

    async def run() -> None:
        app = await view._make_app()
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, view.host, view.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"--web {view.host}:{view.port}: {exc.strerror}") from None
        port = runner.addresses[0][1] if runner.addresses else view.port
        host = f"[{view.host}]" if ":" in view.host else view.host
        announce(f"http://{host}:{port}/?token={view.url_token.reveal()}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(run())
