"""Sizes as people read them, the same in every command: binary units, labelled as such;
and numbers as people write them, checked the same way by every reader of text.

``human_size(5_000_000)`` is ``"4.8 MiB"`` (1 KiB = 1024 bytes): the settings that bound
sizes (cache capacity, fragment cache, request bodies) are powers of two and documented in
KiB/MiB, so the outputs use the same units.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


def is_plain_number(text: str, *, integer: bool = False) -> bool:
    """Whether ``text`` is a number written with ASCII digits: an optional sign, digits
    with an optional point and fraction, an optional exponent (``integer``: digits only).

    Python's ``float`` and ``int`` also read other scripts' digits (``"٣"`` is 3, ``"３"``
    too), underscores (``"1_0"`` is 10) and surrounding white space; contact traces,
    external-events files and the daemon's options check their numbers with this first,
    so they read exactly what the config file's TOML would (``inf`` and ``nan`` are not
    numbers here either)."""
    return (_INTEGER if integer else _NUMBER).fullmatch(text) is not None


def as_given(value: float) -> str:
    """A number as its writer gave it, for an error naming it: an int in full (``100000000001``,
    never ``1e+11``), a float by ``repr`` (the shortest text that reads back the same
    float: ``0.30000000000000004``, never rounded to what it is not)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return repr(float(value))


def human_size(n: float) -> str:
    """``"512 B"``, ``"1.5 KiB"``, ``"4.8 MiB"``, ``"2.0 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
