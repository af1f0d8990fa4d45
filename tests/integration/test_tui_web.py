"""``hetero-top --web``: the listen rule, the token sign-in and the origin checks over real
HTTP, and the page in a real headless Chromium against a real coordinator.

The browser test is marked ``browser`` (``make test-browser``); it skips with one
line where Chromium is absent. Its screenshots are committed under docs/tui/;
``HETERO_UPDATE_SNAPSHOTS=1`` rewrites them.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Unavailable, ensure_browser, start_browser
from simcluster import SimCluster, populate

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tui"
TOKEN = "web-view-token-0123456789abcdef"
UPDATE = os.environ.get("HETERO_UPDATE_SNAPSHOTS") == "1"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Z0-9]")


pytestmark = pytest.mark.slow


def _hetero_top(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetero.tui.cli", *args]


@pytest.fixture
def web(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """``hetero-top --web 127.0.0.1:0`` with a token, of ``request.param``'s view
    (default: an empty run directory); yields (host, port)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    view = getattr(request, "param", None) or ["--run", str(tmp_path / "run")]
    proc = subprocess.Popen(
        _hetero_top("--web", "127.0.0.1:0", "--token-file", str(token_file), *view),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, f"no URL in {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        yield "127.0.0.1", int(found.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _get(port: int, path: str, **headers: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.read()
    return response


def test_a_web_view_beyond_loopback_without_a_token_is_refused_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_TOKEN")}
    done = subprocess.run(
        _hetero_top("--web", "0.0.0.0:0", "--run", "."),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: hetero-top: refusing to serve the web view on 0.0.0.0:0")
    assert len(done.stderr.strip().splitlines()) == 1
    bad = subprocess.run(_hetero_top("--web", "8080"), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: hetero-top: --web 8080: expected HOST:PORT, e.g. 127.0.0.1:8080"
    )


def test_the_token_signs_a_browser_in_once_and_other_hosts_and_origins_are_refused(
    web: tuple[str, int],
) -> None:
    host, port = web
    here = f"{host}:{port}"
    assert _get(port, "/").status == 401
    assert _get(port, "/?token=not-the-token-0123456789").status == 401
    assert _get(port, "/static/js/textual.js").status == 401
    signed = _get(port, f"/?token={TOKEN}")
    assert signed.status == 303 and signed.getheader("Location") == "/"
    cookie = signed.getheader("Set-Cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    session = cookie.split(";", 1)[0]
    page = http.client.HTTPConnection(host, port, timeout=10)
    page.request("GET", "/", headers={"Cookie": session})
    html = page.getresponse().read().decode()
    assert f'data-session-websocket-url="ws://{here}/ws"' in html
    assert "googleapis" not in html, "the page must load nothing from outside"
    assert _get(port, "/", Authorization=f"Bearer {TOKEN}").status == 200
    # DNS rebinding: another name for this loopback server is refused, token or not.
    assert _get(port, "/", Host=f"evil.example:{port}", Cookie=session).status == 403
    # Cross-site websocket: the app's socket only from the page's own origin.
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Cookie": session,
    }
    assert _get(port, "/ws", Origin="http://evil.example", **upgrade).status == 403


def test_a_loopback_view_without_a_token_asks_for_the_one_it_printed(tmp_path: Path) -> None:
    """Issue 33: on loopback without a token, any local user drove the operator's view (a
    plain websocket client cancelled another user's job with the operator's token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_TOKEN")}
    proc = subprocess.Popen(
        _hetero_top("--web", "127.0.0.1:0", "--run", str(tmp_path / "run")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]{40,})", line)
        assert found, f"no URL with a token in {line!r}"
        port, url_token = int(found.group(1)), found.group(2)
        upgrade = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Origin": f"http://127.0.0.1:{port}",
        }
        assert _get(port, "/").status == 401
        assert _get(port, "/ws", **upgrade).status == 401, "the app's socket without a token"
        assert _get(port, "/", Authorization=f"Bearer {url_token}").status == 200
        signed = _get(port, f"/?token={url_token}")
        assert signed.status == 303 and url_token not in (signed.getheader("Set-Cookie") or "")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_window_is_bounded_however_large_the_page_asks() -> None:
    from hetero.tui.web import MAX_COLUMNS, MAX_ROWS, window_cells

    assert window_cells("1000000000", 80, MAX_COLUMNS) == MAX_COLUMNS
    assert window_cells(10**12, 24, MAX_ROWS) == MAX_ROWS
    assert window_cells("-5", 80, MAX_COLUMNS) == 1
    assert window_cells("nan", 80, MAX_COLUMNS) == 80 and window_cells(None, 24, MAX_ROWS) == 24
    assert window_cells("120", 80, MAX_COLUMNS) == 120


# ---- the browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> None:
    try:
        ensure_browser()
    except Unavailable as exc:
        pytest.skip(f"browser unavailable: {exc}")


def _screen_text(driver: object) -> str:
    frames = driver.execute_script("return window.__frames || []")  # type: ignore[attr-defined]
    return _ANSI.sub("", "".join(frames))


def _wait_for(driver: object, words: tuple[str, ...], log: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = _screen_text(driver)
        if all(w in text for w in words):
            return text
        time.sleep(0.25)
    raise AssertionError(
        f"{words} not on the page; it showed: {text.strip()[-1500:]!r}; the server said: "
        f"{log.read_text()[-1500:]}"
    )


def _screenshot(driver: object, name: str, tmp_path: Path) -> None:
    png = driver.get_screenshot_as_png()  # type: ignore[attr-defined]
    assert png.startswith(b"\x89PNG") and len(png) > 10_000, "an empty page"
    (tmp_path / name).write_bytes(png)
    if UPDATE:
        (DOCS / name).write_bytes(png)
    assert (DOCS / name).is_file(), f"docs/tui/{name} missing: HETERO_UPDATE_SNAPSHOTS=1 writes it"


@pytest.mark.browser
def test_the_page_shows_the_cluster_and_a_job_in_chromium(
    chromium: None, coordinator, sim: SimCluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    job = populate(sim)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    server = subprocess.Popen(
        _hetero_top(
            "--web",
            "127.0.0.1:0",
            "--token-file",
            str(token_file),
            "--coordinator",
            coordinator.address,
            "--period",
            "0.5",
        ),
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "web.err").open("w"),
        text=True,
    )
    driver = None
    try:
        assert server.stdout is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", server.stdout.readline())
        assert found
        driver = start_browser(tmp_path / "profile")
        driver.get(f"http://127.0.0.1:{found.group(1)}/?token={TOKEN}")
        assert driver.current_url.endswith(f":{found.group(1)}/"), (
            "the token stayed in the address bar"
        )
        _wait_for(
            driver, ("hetero-top", "● live", "gpu-a", "A100 40GB", "cpu-c"), tmp_path / "web.err"
        )
        time.sleep(1.0)  # the terminal draws the last frame
        _screenshot(driver, "web-cluster.png", tmp_path)
        from selenium.webdriver.common.by import By

        driver.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea").send_keys("2")
        _wait_for(driver, (job.name[:12], "running", "1.29k"), tmp_path / "web.err")
        time.sleep(1.0)
        _screenshot(driver, "web-jobs.png", tmp_path)
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=30)
