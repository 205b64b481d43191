"""Wire format v2: documented test vectors, hostile datagrams, decompression bombs, fuzzing."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import random
import re
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dodwan import Node, NodeConfig
from dodwan.core import message as m
from dodwan.core import wire
from dodwan.core.errors import WireError
from dodwan.core.limits import Limits

LIMITS = Limits()
DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def vectors() -> dict[str, bytes]:
    found = re.findall(r"```vector (\w+)\n([0-9a-f]+)\n```", DOC.read_text())
    return {name: bytes.fromhex(hexa) for name, hexa in found}


def test_documented_vectors_encode_and_decode() -> None:
    v = vectors()
    assert set(v) == {
        "announce", "catalog", "request", "fragment", "fragment_by_digest", "profile",
        "profile_request", "ack",
    }  # fmt: skip
    assert wire.decode(v["ack"], LIMITS) == wire.Ack("b2", (("m1", 300), ("m2", 5)))
    assert [v["ack"]] == wire.encode_acks("b2", [("m1", 300), ("m2", 5)], 1400)
    assert v["announce"] == wire.encode_announce(
        "a1", 7, False, 0x01020304, 2, (wire.ProfileRef("c3", 1, 0x0A0B0C0D, 1),), ()
    )
    ann = wire.decode(v["announce"], LIMITS)
    assert isinstance(ann, wire.Announce)
    assert (ann.sender, ann.seq, ann.altruistic, ann.version, ann.pieces) == (
        "a1", 7, False, 0x01020304, 2,
    )  # fmt: skip
    assert ann.relayed == (wire.ProfileRef("c3", 1, 0x0A0B0C0D, 1),)

    cat = wire.decode(v["catalog"], LIMITS)
    assert isinstance(cat, wire.Catalog)
    assert [(e.msg_id, e.frags, e.have, e.zdesc) for e in cat.catalog] == [
        ("m1", 3, None, b"\x28\xb5"),
        ("m2", 10, 0b1000000101, b"Z"),
    ]
    req = wire.decode(v["request"], LIMITS)
    assert req == wire.Request("b2", "a1", (("m2", ((1, 2), (3, 6))),))
    assert v["request"] == wire.encode_request("b2", "a1", [("m2", [(1, 2), (3, 6)])])
    frag = wire.decode(v["fragment"], LIMITS)
    assert frag == wire.Fragment("a1", "m1", 2, 1, b"\x01\x02", b"chunk")
    assert v["fragment"] == wire.encode_fragment("a1", "m1", 2, 1, b"\x01\x02", b"chunk")
    digest = hashlib.blake2b(b"\x01\x02", digest_size=8).digest()
    assert wire.decode(v["fragment_by_digest"], LIMITS) == wire.Fragment(
        "a1", "m1", 2, 1, b"", b"chunk", digest
    )
    assert v["fragment_by_digest"] == wire.encode_fragment_by_digest(
        "a1", "m1", 2, 1, b"\x01\x02", b"chunk"
    )
    piece = ((("lang", "en|fr"),),)
    assert wire.decode(v["profile"], LIMITS) == wire.ProfilePiece(
        "b2", "c3", 0x0A0B0C0D, 1, 0, piece
    )
    assert v["profile"] == wire.encode_profile_piece("b2", "c3", 0x0A0B0C0D, 1, 0, piece)
    preq = wire.decode(v["profile_request"], LIMITS)
    assert preq == wire.ProfileRequest("a1", "b2", (("c3", 0x0A0B0C0D, ((0, 1),)),))
    assert v["profile_request"] == wire.encode_profile_request(
        "a1", "b2", [("c3", 0x0A0B0C0D, [(0, 1)])]
    )


def test_every_truncation_of_every_vector_is_rejected_cleanly() -> None:
    for name, data in vectors().items():
        for cut in range(len(data)):
            if name.startswith("fragment") and cut > len(data) - len(b"chunk"):
                continue  # a shorter chunk is still a well-formed fragment
            try:
                wire.decode(data[:cut], LIMITS)
            except WireError:
                continue
            raise AssertionError(f"{name} truncated at {cut} decoded")


def fresh_node() -> Node:
    n = Node(NodeConfig(host_id="victim"), rng=random.Random(0))
    n.subscribe({"topic": ".*"}, now=0)
    n.handle_timer(0)
    return n


def test_foreign_and_oversized_datagrams_are_counted_not_raised() -> None:
    n = fresh_node()
    n.receive_datagram(b"GET / HTTP/1.1\r\n\r\n", "x", now=1)
    n.receive_datagram(b"DW\x02\x01\x01a", "x", now=1)  # unknown version
    n.receive_datagram(b"DW\x01\x09\x01a", "x", now=1)  # unknown kind
    n.receive_datagram(b"", "x", now=1)
    n.receive_datagram(b"DW\x01\x04" + b"\xff" * 70000, "x", now=1)
    assert n.counters["datagrams_dropped"] == 5
    assert n.counters["dropped_foreign"] == 2
    assert n.counters["dropped_version"] == 1
    assert n.counters["dropped_oversized"] == 1
    assert n.neighbours() == {}


def hostile_fragment(
    desc: dict[str, str], zpayload: bytes, index: int = 0, chunk: bytes | None = None
) -> bytes:
    zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(desc))
    return wire.encode_fragment(
        "evil", desc["id"], 1, index, zdesc, zpayload if chunk is None else chunk
    )


def bomb_descriptor(zpayload: bytes, size: int) -> dict[str, str]:
    return {
        "id": "bomb",
        "topic": "x",
        "deadline": "1000.0",
        "origin": "evil",
        "date": "0.0",
        "size": str(size),
        "priority": "4",
        "persistent": "true",
        "zsize": str(len(zpayload)),
        "frags": "1",
        "fsize": str(len(zpayload)),
        "zhash": m.payload_digest(zpayload),
    }


def test_decompression_bomb_declaring_a_small_size_is_refused_before_inflating() -> None:
    zbomb = zstandard.ZstdCompressor().compress(b"\0" * (200 << 20))  # 200 MB -> ~6 KB
    n = Node(NodeConfig(host_id="victim", max_datagram=65000), rng=random.Random(0))
    n.subscribe({"topic": ".*"}, now=0)
    n.receive_datagram(hostile_fragment(bomb_descriptor(zbomb, 10), zbomb), "evil", now=1)
    assert all(type(e).__name__ != "MessageDelivered" for e in iter(n.next_event, None))
    assert n.counters.get("corrupt_messages", 0) == 1
    assert n.cache_listing() == []


def test_decompression_bomb_over_the_size_limit_is_refused_at_the_descriptor() -> None:
    zbomb = zstandard.ZstdCompressor().compress(b"\0" * (200 << 20))
    n = Node(NodeConfig(host_id="victim", max_datagram=65000), rng=random.Random(0))
    n.subscribe({"topic": ".*"}, now=0)
    n.receive_datagram(hostile_fragment(bomb_descriptor(zbomb, 200 << 20), zbomb), "evil", now=1)
    assert n.counters["dropped_bad_descriptor"] == 1
    assert n.cache_listing() == []


def test_fragment_with_wrong_length_or_index_is_dropped() -> None:
    z = zstandard.ZstdCompressor().compress(b"hello" * 10)
    d = bomb_descriptor(z, 50)
    n = fresh_node()
    n.receive_datagram(hostile_fragment(d, z, chunk=z[:-1]), "evil", now=1)
    n.receive_datagram(hostile_fragment(d, z, index=3), "evil", now=1)
    assert n.counters["dropped_fragment_length_mismatch"] == 1
    assert n.counters["dropped_fragment_index_out_of_range"] == 1
    n.receive_datagram(hostile_fragment(d, z), "evil", now=1)
    delivered = [e for e in iter(n.next_event, None) if type(e).__name__ == "MessageDelivered"]
    assert [e.payload for e in delivered] == [b"hello" * 10]  # type: ignore[union-attr]


def _profile_from(n: Node, sender: str, specs: wire.PatternSpecs, version: int) -> None:
    """``sender`` announces a one-piece profile, then sends the piece ``n`` asks for."""
    n.receive_datagram(wire.encode_announce(sender, 1, False, version, 1, (), ()), sender, now=1)
    piece = wire.encode_profile_piece(sender, sender, version, 1, 0, specs)
    n.receive_datagram(piece, sender, now=1)


def test_hostile_regex_in_a_profile_cannot_stall_matching() -> None:
    from dodwan.core.patterns import Profile

    specs = ((("topic", "(a*)*b"),), (("x", "(x+x+)+y"),))
    version = Profile.from_patterns([dict(p) for p in specs]).version
    n = fresh_node()
    n.publish({"topic": "a" * 3500, "x": "x" * 3500}, b"p", deadline=100, now=0)
    _profile_from(n, "evil", specs, version)
    assert "evil" in n.neighbours()
    assert n.neighbours()["evil"]["patterns"] == [dict(p) for p in specs]
    _profile_from(n, "evil2", ((("topic", r"(a)\1"),),), 2)
    assert n.counters["dropped_bad_pattern"] == 1


valid = list(vectors().values())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_escape(data: bytes) -> None:
    with contextlib.suppress(WireError):
        wire.decode(data, LIMITS)
    n = fresh_node()
    n.receive_datagram(data, "fuzz", now=1)
    n.receive_datagram(b"DW\x01" + data, "fuzz", now=1)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(valid),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
)
def test_fuzz_mutated_valid_datagrams_never_escape(
    base: bytes, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(base)
    for pos, val in flips:
        data[pos % len(data)] = val
    with contextlib.suppress(WireError):
        wire.decode(bytes(data), LIMITS)
    n = fresh_node()
    n.receive_datagram(bytes(data), "fuzz", now=1)
    n.handle_timer(now=2)
    n.datagrams_to_send(now=2)


def test_fragment_encoding_follows_the_documented_layout() -> None:
    varints = {0: b"\x00", 1: b"\x01", 127: b"\x7f", 128: b"\x80\x01", 300: b"\xac\x02",
               16383: b"\xff\x7f", 16384: b"\x80\x80\x01", 65535: b"\xff\xff\x03"}  # fmt: skip
    head = wire.MAGIC + bytes((wire.VERSION, wire.FRAGMENT)) + b"\x02a1" + b"\x02m1" + b"\x02"
    for index, varint in varints.items():
        expected = head + varint + b"\x02\x01\x02" + b"chunk"
        prefix, suffix = wire.fragment_encoder("a1", "m1", b"\x01\x02")
        assert wire.encode_fragment_fast(prefix, suffix, 2, index, b"chunk") == expected
        assert wire.encode_fragment("a1", "m1", 2, index, b"\x01\x02", b"chunk") == expected
        far = wire.encode_fragment_fast(prefix, suffix, 300, index, b"chunk")  # hops cap at 255
        assert far == head[:-1] + b"\xff" + varint + b"\x02\x01\x02" + b"chunk"
        assert wire.decode(expected, LIMITS) == wire.Fragment(
            "a1", "m1", 2, index, b"\x01\x02", b"chunk"
        )


def _outcome(decoder, data: bytes, limits: Limits) -> object:  # type: ignore[no-untyped-def]
    try:
        return decoder(data, limits)
    except WireError as exc:
        return ("error", exc.reason)


@settings(max_examples=400, deadline=None)
@given(
    sender=st.text(min_size=0, max_size=140),
    msg_id=st.text(min_size=0, max_size=140),
    hops=st.integers(0, 255),
    index=st.integers(0, 1 << 20),
    zdesc=st.binary(max_size=20000),
    chunk=st.binary(max_size=50),
    cut=st.integers(0, 400),
    flip=st.tuples(st.integers(0, 300), st.integers(0, 255)),
)
def test_inline_fragment_decoder_agrees_with_the_general_one(
    sender: str,
    msg_id: str,
    hops: int,
    index: int,
    zdesc: bytes,
    chunk: bytes,
    cut: int,
    flip: tuple[int, int],
) -> None:
    limits = Limits(max_descriptor_bytes=8192, max_fragments=50000)
    variants = []
    for data in (
        wire.encode_fragment(sender, msg_id, hops, index, zdesc, chunk),
        wire.encode_fragment_by_digest(sender, msg_id, hops, index, zdesc, chunk),
    ):
        variants += [data, data[: len(data) - cut]]
        if flip[0] < len(data):
            mutated = bytearray(data)
            mutated[flip[0]] = flip[1]
            variants.append(bytes(mutated))
    for d in variants:
        if len(d) > 4:
            fast = _outcome(wire._decode_fragment, d, limits)
            general = _outcome(wire._decode_fragment_general, d, limits)
            assert fast == general


_PLAIN = st.text(alphabet=st.sampled_from(list("ab.-_:@ é\\*+?()|[]{}^$#~&\t")), max_size=8)


@settings(max_examples=400, deadline=None)
@given(_PLAIN, _PLAIN)
def test_plain_string_patterns_match_exactly_as_re2_does(regex: str, value: str) -> None:
    """Patterns without operators are matched by string comparison (a fast path): the
    answer must be RE2's for every expression, escaped (re.escape) or not."""
    from dodwan.core.patterns import Pattern, RegexError, compile_regex

    for rx in (regex, re.escape(regex)):
        try:
            want = compile_regex(rx).fullmatch(value) is not None
        except RegexError:
            continue
        assert Pattern.from_spec({"a": rx}).matches({"a": value}) == want, (rx, value)
    assert Pattern.from_spec({"a": re.escape(value)}).matches({"a": value})


def test_varints_and_strings_encode_as_before() -> None:
    """The one-byte fast path of varints: same bytes as the general loop."""
    assert [wire._varint(n) for n in (0, 1, 127, 128, 300, 1 << 21)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\x80\x80\x80\x01",
    ]  # fmt: skip
    assert wire._str("é" * 64) == b"\x80\x01" + "é".encode() * 64
    assert wire.encode_attributes({"b": "2", "a": ""}) == b"\x02\x01a\x00\x01b\x012"
    with pytest.raises(ValueError):
        wire._varint(-1)


_ASCII_OR_NOT = st.one_of(
    st.text(st.characters(max_codepoint=127), max_size=140), st.text(max_size=140)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_ASCII_OR_NOT, _ASCII_OR_NOT, max_size=140))
def test_descriptor_encoding_fast_path_gives_the_general_bytes(attrs: dict[str, str]) -> None:
    """ASCII strings under 128 characters are encoded as one str: the same bytes as the
    general encoder, with names remembered from earlier calls or not, and for the mix of
    short and long, ASCII and not, fewer and more than 127 attributes."""
    want = wire._encode_attributes(attrs)
    assert wire.encode_attributes(attrs) == want
    assert wire.encode_attributes(attrs) == want  # names now remembered


def _reference_decode_attributes(raw: bytes, limits: Limits) -> dict[str, str]:
    """The straightforward reader the inline decoder must agree with, result and error."""
    r = wire._Reader(raw)
    n = r.varint(limits.max_attributes)
    out: dict[str, str] = {}
    for _ in range(n):
        name = r.text(limits.max_attribute_name)
        value = r.text(limits.max_descriptor_bytes)
        if not name or name in out:
            raise WireError("bad attribute name")
        out[name] = value
    r.end()
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.text(max_size=140), st.text(max_size=300), max_size=12),
    st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=4),
    st.integers(-3, 3),
)
def test_descriptor_decoding_agrees_with_the_reference_reader_on_any_bytes(
    attrs: dict[str, str], edits: list[tuple[int, int]], cut: int
) -> None:
    limits = Limits(max_attribute_name=100, max_attributes=10)
    raw = bytearray(wire.encode_attributes(attrs))
    for where, byte in edits:  # corrupt a few bytes: lengths, varints, utf-8
        if raw:
            raw[where % len(raw)] = byte
    data = bytes(raw[: len(raw) + cut] if cut < 0 else raw + b"\x80" * cut)
    assert _outcome(wire.decode_attributes, data, limits) == _outcome(
        _reference_decode_attributes, data, limits
    )


def test_the_space_is_the_only_printable_whitespace() -> None:
    """check_message_id tests ids for " " after isprintable(): no other whitespace
    character, in the whole of Unicode, is printable."""
    printable_spaces = [c for c in map(chr, range(0x110000)) if c.isspace() and c.isprintable()]
    assert printable_spaces == [" "]
    for bad in ("a b", "a\tb", "a\u00a0b", "a\u2028b", "a\u3000b", ""):
        with pytest.raises(ValueError):
            m.check_message_id(bad)
    m.check_message_id("h1-\u00e9t\u00e9")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.floats(0, 1e9, allow_nan=False),
    st.floats(1e-6, 6e5, allow_nan=False),
    st.integers(0, 9),
    st.booleans(),
    st.integers(0, 5000),
    st.sampled_from([600, 1400, 65000]),
)
def test_a_publication_header_is_what_its_descriptor_parses_to(
    now: float, ttl: float, priority: int, persistent: bool, size: int, max_datagram: int
) -> None:
    """Node.publish builds its Header from the values it sets, not by parsing their
    strings back: the same Header as parsing the descriptor that travels."""
    n = Node(NodeConfig(host_id="h1", max_datagram=max_datagram), rng=random.Random(size))
    payload = random.Random(size).randbytes(size // 2) + b"x" * (size - size // 2)
    deadline = now + ttl
    if not deadline > now:
        return
    msg_id = n.publish({"a": "b"}, payload, deadline, now, priority, persistent)
    c = n._cache[msg_id]
    assert c.header == m.Header.parse(c.descriptor, Limits())
    assert c.header == m.Header.parse(m.decompress_descriptor(c.meta.zdesc, Limits()), Limits())


def _verdict(check: object) -> str:
    try:
        check()  # type: ignore[operator]
    except WireError as e:
        return e.reason
    return "ok"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
    flip=st.one_of(st.none(), st.integers(min_value=0, max_value=4000)),
    size_delta=st.sampled_from([0, 0, 1, -1]),
    drop=st.booleans(),
)
def test_verifying_fragments_in_place_agrees_with_verifying_them_joined(
    payload: bytes, cuts: list[int], flip: int | None, size_delta: int, drop: bool
) -> None:
    """A completed message is checked fragment by fragment (never joined for a carrier):
    the verdict is the one of the joined payload, whatever the cuts, corruption (a flipped
    byte, a wrong declared size, a missing tail, a frame header split over fragments)."""
    z = zstandard.ZstdCompressor(level=3).compress(payload)
    header = m.Header(
        "x", 10.0, "o", 0.0, len(payload) + size_delta, len(z), 1, len(z),
        m.payload_digest(z), 4, True, False,
    )  # fmt: skip
    data = bytearray(z)
    if flip is not None:
        data[flip % len(data)] ^= 0x41
    if drop:
        del data[len(data) // 2 :]
    whole = bytes(data)
    bounds = sorted({0, len(whole), *(c % (len(whole) + 1) for c in cuts)})
    chunks = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    joined = _verdict(lambda: m.verify_payload(whole, header))
    assert _verdict(lambda: m.verify_chunks(chunks, header)) == joined
    if flip is None and not drop and size_delta == 0:
        assert joined == "ok"


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def test_varints_from_the_tables_are_the_encoding_itself() -> None:
    for n in [*range(0, 0x4200), 0x1FFFFF, 0x200000, 2**35 + 7]:
        assert wire._varint(n) == _leb128(n), n


@pytest.mark.parametrize("sender", ["a", "h" * 200])
def test_announce_overhead_is_the_length_of_an_announcement_without_refs_or_entries(
    sender: str,
) -> None:
    for seq in (0, 1, 127, 128, 16383, 16384, 2**21, 2**40):
        for pieces in (0, 1, 127, 128, 300):
            for altruistic in (False, True):
                bare = wire.encode_announce(sender, seq, altruistic, 0xDEADBEEF, pieces, (), ())
                assert wire.announce_overhead(sender, seq, pieces) == len(bare)
