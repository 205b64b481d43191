"""Fragment bitmasks: bit ``i`` set means fragment ``i``."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=256)
def all_of(frags: int) -> int:
    """The mask of all ``frags`` fragments, one shared int per count: offers of complete
    messages remembered per neighbour cost a reference each, not up to 8 KiB each (a
    crowd offering ids that declare 65,536 fragments took +900 MB for 1.4 MB sent)."""
    return (1 << frags) - 1


def indexes(mask: int) -> list[int]:
    """Bitmask -> indexes of its set bits, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def first_bits(mask: int, n: int) -> int:
    """The ``n`` lowest set bits of ``mask``."""
    out = 0
    while mask and n:
        low = mask & -mask
        out |= low
        mask ^= low
        n -= 1
    return out
