"""A headless Chromium from the Debian packages, driven by Selenium through chromedriver.

Nothing is downloaded: the browser is ``/usr/bin/chromium`` and the driver
``/usr/bin/chromedriver`` (packages ``chromium`` and ``chromium-driver``). With
``HETERO_BROWSER_INSTALL=1`` (``make test-browser``) a root process on Debian
installs them with apt-get when they are missing; otherwise a missing browser
is :class:`Unavailable`, which the fixture turns into a one-line skip. Each
browser gets a fresh profile directory and no background network traffic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")
#: Seconds allowed for apt-get (update and install).
INSTALL_TIMEOUT_S = 900
ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,720",
)
#: Every websocket message the page receives, kept for the test to read (the terminal
#: draws on a canvas, so the page's DOM holds no text).
RECORD_WEBSOCKETS = """
window.__frames = [];
const Native = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const ws = new Native(url, protocols);
  ws.addEventListener("message", (e) => {
    window.__frames.push(typeof e.data === "string" ? e.data
      : new TextDecoder().decode(new Uint8Array(e.data)));
  });
  return ws;
};
window.WebSocket.prototype = Native.prototype;
"""


class Unavailable(Exception):
    """No browser here, and none may be installed; the message says why, in one line."""


def _present() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def ensure_browser() -> None:
    """Chromium and chromedriver are there, installed first if allowed; else ``Unavailable``."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise Unavailable("selenium not installed (pip install 'hetero[test]')") from None
    if _present():
        return
    if os.environ.get("HETERO_BROWSER_INSTALL") != "1":
        raise Unavailable(f"{CHROMIUM} or {CHROMEDRIVER} missing (make test-browser installs them)")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable("chromium not installed, and apt-get needs root on a Debian host")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{' '.join(cmd)} took over {INSTALL_TIMEOUT_S} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"{' '.join(cmd)} failed: {last}")
    if not _present():
        raise Unavailable(f"apt-get installed {PACKAGES} but {CHROMIUM} is still missing")


def start_browser(profile: Path) -> Any:
    """A headless Chromium with a fresh profile under ``profile`` that records websocket
    messages in ``window.__frames``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (*ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_WEBSOCKETS})
    return driver
