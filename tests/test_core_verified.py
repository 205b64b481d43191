"""Verdicts on completed copies shared by the nodes of one process (``VerifiedPayloads``):
an equal copy gets the verdict of the copy accepted before, anything else is hashed."""

from __future__ import annotations

import dataclasses
import random

import pytest

from dodwan.core import message as m
from dodwan.core.errors import WireError

FSIZE = 1000


def payload(size: int = 5000, seed: int = 0) -> tuple[list[bytes], m.Header]:
    raw = random.Random(seed).randbytes(size)  # incompressible: several fragments
    z = m.compressor(3).compress(raw)
    frags = -(-len(z) // FSIZE)
    header = m.Header(
        msg_id="x", deadline=100.0, origin="o", date=0.0, size=len(raw), zsize=len(z),
        frags=frags, fsize=FSIZE, zhash=m.payload_digest(z), priority=0, persistent=False,
    )  # fmt: skip
    return [z[i : i + FSIZE] for i in range(0, len(z), FSIZE)], header


def copy(chunks: list[bytes]) -> list[bytes]:
    """Equal chunks in other objects, as another host would hold them."""
    return [bytes(bytearray(c)) for c in chunks]


def test_an_equal_copy_gets_the_verdict_without_hashing() -> None:
    chunks, header = payload()
    v = m.VerifiedPayloads()
    v.verify(chunks, header)
    assert v.hits == 0
    again = copy(chunks)
    assert again[0] is not chunks[0]
    v.verify(again, header)
    assert v.hits == 1


def test_a_corrupt_copy_is_refused_and_the_good_one_stays() -> None:
    chunks, header = payload()
    v = m.VerifiedPayloads()
    v.verify(chunks, header)
    bad = copy(chunks)
    bad[1] = bytes([bad[1][0] ^ 1]) + bad[1][1:]
    with pytest.raises(WireError, match="digest"):
        v.verify(bad, header)
    short = copy(chunks)[:-1]
    with pytest.raises(WireError):
        v.verify(short, header)
    assert v.hits == 0
    v.verify(copy(chunks), header)  # the copy accepted first is still held
    assert v.hits == 1


def test_a_copy_is_compared_only_under_the_same_fields() -> None:
    chunks, header = payload()
    v = m.VerifiedPayloads()
    v.verify(chunks, header)
    other = dataclasses.replace(header, size=header.size + 1)
    with pytest.raises(WireError, match="size"):
        v.verify(copy(chunks), other)  # equal chunks, but they declare another size
    assert v.hits == 0


def test_what_is_held_stays_within_its_bytes() -> None:
    v = m.VerifiedPayloads(max_bytes=12_000)
    held = [payload(4000, seed=i) for i in range(5)]
    for chunks, header in held:
        v.verify(chunks, header)
    assert v._bytes <= 12_000
    v.verify(copy(held[-1][0]), held[-1][1])  # the newest is held
    assert v.hits == 1
    v.verify(copy(held[0][0]), held[0][1])  # the oldest went: hashed again
    assert v.hits == 1
    big, header = payload(20_000, seed=9)
    v.verify(big, header)  # larger than the whole budget: checked, not held
    v.verify(copy(big), header)
    assert v.hits == 1
    assert v._bytes <= 12_000
