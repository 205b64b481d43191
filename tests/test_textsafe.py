"""``dodwan.textsafe``: what every command line tool does to peer text before printing it."""

from __future__ import annotations

import unicodedata

import pytest

from dodwan.textsafe import safe, safe_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain ascii [/x] \\d", "plain ascii [/x] \\d"),  # unchanged, markup included
        ("é 日本 Ωmega ñ 🙂 a\u00a0b", "é 日本 Ωmega ñ 🙂 a\u00a0b"),  # readable non-ASCII kept
        ("\x1b[2J\x1b]0;pwned\x07", "\\x1b[2J\\x1b]0;pwned\\x07"),  # C0
        ("a\x7fb\x9b31m\x85", "a\\x7fb\\x9b31m\\x85"),  # DEL, C1 (CSI, NEL)
        ("l1\nl2\tx\r", "l1\\x0al2\\x09x\\x0d"),
        ("abc\u202egnp.exe", "abc\\u202egnp.exe"),  # displays as abcexe.png when raw
        (
            "\u061c\u200e\u200f\u202a\u202b\u202c\u202d",
            "\\u061c\\u200e\\u200f\\u202a\\u202b\\u202c\\u202d",
        ),
        ("\u2066x\u2067y\u2068z\u2069", "\\u2066x\\u2067y\\u2068z\\u2069"),  # isolates
        ("zero\u200bwidth\u2060joiner\ufeff", "zero\\u200bwidth\\u2060joiner\\ufeff"),
        ("tag\U000e0041", "tag\\U000e0041"),  # a tag character (Cf) beyond the BMP
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),  # separators some tools break on
        ("lone \ud800", "lone \\ud800"),  # a surrogate that no terminal encoding takes
    ],
)
def test_safe(raw: str, shown: str) -> None:
    assert safe(raw) == shown


def test_safe_text_keeps_line_breaks_and_tabs_only() -> None:
    assert safe_text("a\n\tb\r\n\x1b[2Jc\u202e") == "a\n\tb\\x0d\n\\x1b[2Jc\\u202e"
    assert safe_text("plain\ntext é") == "plain\ntext é"


def test_safe_takes_any_value() -> None:
    assert safe(42) == "42" and safe(None) == "None" and safe(["\x1b"]) == "['\\x1b']"


def test_every_code_point_is_kept_or_escaped() -> None:
    every = "".join(chr(c) for c in range(0x110000))
    hidden = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    out = safe(every)
    assert not [c for c in out if unicodedata.category(c) in hidden]
    kept = {c for c in every if unicodedata.category(c) not in hidden}
    assert kept <= set(out)
    assert len(out) == len(kept) + sum(
        len(f"{ord(c):02x}") + 2 if ord(c) < 0x100 else 6 if ord(c) < 0x10000 else 10
        for c in every
        if unicodedata.category(c) in hidden
    )
