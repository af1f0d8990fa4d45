"""Database URLs in messages: the password masked, a missing driver named.

A URL given with ``--db`` or ``db:`` may carry a password
(``postgresql://hetero:secret@db/hetero``). Every message and log line that
shows it goes through :func:`masked`, so the password never reaches a
terminal, journald or a bug report. A URL whose dialect needs a Python driver
that is not installed fails in SQLAlchemy with ``ModuleNotFoundError`` deep in
its dialect; :func:`missing_driver` turns that into one line naming the
package to install.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

#: ``scheme://user:password@``: what :func:`masked` hides when SQLAlchemy cannot parse
#: the URL (a malformed URL may still hold a password).
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+._-]*:/*[^:/@\s]*):\S*@")

#: Query parameters some drivers take a password in (``?password=...``).
_PASSWORD_PARAMETERS = frozenset({"password", "passwd", "pwd", "sslpassword"})

#: The PyPI package of each DB-API module SQLAlchemy imports by name.
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "asyncpg": "asyncpg",
    "pg8000": "pg8000",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "oracledb": "oracledb",
    "pyodbc": "pyodbc",
}


def masked(url: str) -> str:
    """``url`` with any password replaced by ``***`` (also when it does not parse)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return _CREDENTIALS.sub(r"\g<head>:***@", url)
    hidden = {k: "***" for k in parsed.query if k.lower() in _PASSWORD_PARAMETERS}
    return parsed.update_query_dict(hidden).render_as_string(hide_password=True)


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's error message) without the URL's password, wherever it shows."""
    text = text.replace(url, masked(url))
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return text
    secrets = [str(v) for k, v in parsed.query.items() if k.lower() in _PASSWORD_PARAMETERS]
    for secret in [str(parsed.password or ""), *secrets]:
        if secret:
            text = text.replace(secret, "***")
    return text


def missing_driver(url: str, exc: ImportError) -> str:
    """One line: the URL (masked) needs the Python module ``exc`` failed to import."""
    module = (exc.name or "").split(".")[0] or "its driver"
    package = DRIVER_PACKAGES.get(module, module)
    return (
        f"database URL {masked(url)} needs the Python driver {module!r}, which is not "
        f"installed: pip install '{package}'"
    )
