"""Sizes as people read them, the same in every command: binary units, labelled as such.

``human_size(5_000_000)`` is ``"4.8 MiB"`` (1 KiB = 1024 bytes): the settings that bound
sizes (cache capacity, fragment cache, request bodies) are powers of two and documented in
KiB/MiB, so the outputs use the same units.
"""

from __future__ import annotations


def human_size(n: float) -> str:
    """``"512 B"``, ``"1.5 KiB"``, ``"4.8 MiB"``, ``"2.0 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
