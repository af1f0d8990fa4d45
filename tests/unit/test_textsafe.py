"""``core.textsafe.printable``: no byte of a shown field reaches the terminal as control."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hetero.core.textsafe import printable

ATTACKS = {
    "OSC 0 (title)": "\x1b]0;pwned\x07",
    "OSC 52 (clipboard)": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "clear screen": "\x1b[2J\x1b[H",
    "alternate screen": "\x1b[?1049h",
    "C1 CSI": "\x9b2J",
    "carriage return": "ok\rforged",
}


def test_every_attack_comes_out_as_visible_escapes() -> None:
    for name, attack in ATTACKS.items():
        shown = printable(f"loss 0.1 {attack} done")
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown), name
    assert printable("\x1b]0;t\x07") == "\\x1b]0;t\\x07"
    assert printable("\x9b2J") == "\\x9b2J"


def test_multiline_text_keeps_newlines_and_tabs_only() -> None:
    assert printable("a\tb\nc\x1b[2J", multiline=True) == "a\tb\nc\\x1b[2J"
    assert printable("a\tb\nc") == "a\\x09b\\x0ac"


@given(st.text())
def test_printable_text_is_left_as_it_is(text: str) -> None:
    clean = "".join(c for c in text if not (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0))
    assert printable(clean) == clean
