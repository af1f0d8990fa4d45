"""Text from a job, a node or a user, made unable to drive the terminal that shows it.

A job's log lines, a node's device names and CPU model, a job's name, owner and
messages all come from someone other than the person reading them. Written raw,
an escape sequence in them sets the terminal's title (OSC 0), its clipboard
(OSC 52: a command pasted later), clears the screen, moves the cursor to hide or
forge lines, or switches to the alternate screen. :func:`printable` writes every
C0 control character (U+0000-U+001F), DEL and every C1 control character
(U+0080-U+009F, which some terminals read as ESC + a letter: U+009B is CSI) as a
visible escape, ``\\x1b``; the text is otherwise unchanged. What the terminal
receives is then letters only, whichever terminal it is.

``\\n`` and ``\\t`` are kept where the text is meant to be several lines (a log
line, a message shown in a panel); everywhere else (a name in a table cell) they
are escaped too, so a field cannot forge a row.
"""

from __future__ import annotations

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]

#: ``str.translate`` tables: each control character to its ``\\xNN`` escape.
_ONE_LINE = {c: f"\\x{c:02x}" for c in _CONTROLS}
_MULTILINE = {c: e for c, e in _ONE_LINE.items() if chr(c) not in "\n\t"}


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` with every C0 and C1 control character and DEL written as ``\\xNN``
    (module doc); ``multiline`` keeps ``\\n`` and ``\\t``."""
    return text.translate(_MULTILINE if multiline else _ONE_LINE)
