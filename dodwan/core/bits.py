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


_WORD = 64
_WORD_MASK = (1 << _WORD) - 1


def first_bits(mask: int, n: int) -> int:
    """The ``n`` lowest set bits of ``mask`` (``mask`` >= 0): the mask cut just above its
    ``n``-th set bit, found a 64-bit word at a time rather than bit by bit (a request
    window is 256 fragments of a message of up to thousands)."""
    if n <= 0:
        return 0
    if mask.bit_count() <= n:
        return mask
    cut = 0
    while True:
        word = (mask >> cut) & _WORD_MASK
        count = word.bit_count()
        if count >= n:
            break
        n -= count
        cut += _WORD
    while True:  # the n-th set bit of this word
        low = word & -word
        n -= 1
        if not n:
            return mask & ((low << (cut + 1)) - 1)
        word ^= low
