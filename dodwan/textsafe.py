"""Text from peers made fit for a terminal: every command line tool prints it through here.

Attributes, ids, host ids, subscription patterns, JOMS destination names, properties and
payloads may come from any peer (and scenario names from any file). Printed raw, a control
character acts on the user's terminal (``ESC [2J`` clears it, ``ESC ] 0;`` retitles it, a
carriage return or a C1 CSI fakes lines), and a Unicode bidi override or an invisible
character makes the text read otherwise than it is (``abc\\u202egnp.exe`` displays as
``abcexe.png``).

:func:`safe` shows each such character as an escape: ``\\xNN`` for C0 and C1 controls and
DEL, ``\\uXXXX`` (``\\UXXXXXXXX`` beyond the BMP) for format characters (Unicode category
Cf: bidi controls U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069, zero-width
characters, the BOM...), line and paragraph separators (Zl, Zp) and lone surrogates (Cs,
which a terminal's encoder would refuse). Every other character, ordinary non-ASCII
letters included (``é``, ``日本``), is kept. :func:`safe_text` does the same for a text
shown as text (a payload, a message body), keeping its line breaks and tabs.
"""

from __future__ import annotations

import re
import unicodedata

_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories escaped: controls, format characters, separators that break lines,
surrogates."""
_CANDIDATE = re.compile(r"[^\x20-\x7e]")
"""Any character outside printable ASCII: the only ones that may need an escape."""
_TEXT_CANDIDATE = re.compile(r"[^\x20-\x7e\n\t]")
_memo: dict[str, str] = {}


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(match: re.Match[str]) -> str:
    ch = match.group()
    out = _memo.get(ch)
    if out is None:
        out = _escape(ch) if unicodedata.category(ch) in _HIDDEN else ch
        if len(_memo) < 4096:  # bounded: a peer chooses which characters come
            _memo[ch] = out
    return out


def safe(value: object) -> str:
    """``str(value)`` for a terminal: controls, format characters, line separators as
    escapes (see the module's documentation); ordinary text unchanged."""
    text = str(value)
    if text.isprintable():  # fast path: nothing of category C or Z but spaces
        return text
    return _CANDIDATE.sub(_shown, text)


def safe_text(text: str) -> str:
    """A text shown as text (payload, body): as :func:`safe`, but ``\\n`` and ``\\t`` kept."""
    if text.isascii() and text.isprintable():
        return text
    return _TEXT_CANDIDATE.sub(_shown, text)
