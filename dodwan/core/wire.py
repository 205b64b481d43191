"""Wire format v2: the only module that packs or unpacks bytes (spec: docs/protocol.md).

Every datagram starts with ``b"DW"``, a version byte (2), a kind byte and the sender's host
id. Lengths and integers are unsigned LEB128 varints; strings are UTF-8 prefixed by their
byte length. Decoding is strict: truncation, trailing bytes, out-of-range values and
anything beyond the :class:`~dodwan.core.limits.Limits` raise :class:`WireError`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import WireError
from .limits import Limits

MAGIC = b"DW"
VERSION = 2

ANNOUNCE = 1
CATALOG = 2
REQUEST = 3
FRAGMENT = 4
PROFILE = 5
PROFILE_REQUEST = 6
ACK = 7
FRAGMENT_BY_DIGEST = 8
KIND_NAMES = {
    ANNOUNCE: "announce",
    CATALOG: "catalog",
    REQUEST: "request",
    FRAGMENT: "fragment",
    PROFILE: "profile",
    PROFILE_REQUEST: "profile_request",
    ACK: "ack",
    FRAGMENT_BY_DIGEST: "fragment",  # a fragment all the same (logs count them as such)
}
FRAGMENT_KINDS = (FRAGMENT, FRAGMENT_BY_DIGEST)
DESCRIPTOR_DIGEST_SIZE = 8
"""Bytes of the descriptor digest a fragment by digest carries instead of the descriptor."""

MAX_HOST_ID = 64
MAX_MSG_ID = 128
FLAG_ALTRUISTIC = 0x01
FLAG_SAME_RELAYS = 0x02
ENTRY_COMPLETE = 0x01
ENTRY_COPIES_SHIFT = 1  # bits 1-7 of a catalog entry's flags: the copy budget (0: none)
ENTRY_MAX_COPIES = 0x7F

PatternSpecs = tuple[tuple[tuple[str, str], ...], ...]


# ---------------------------------------------------------------- decoded datagrams


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """A host's profile named by its version: the patterns travel in profile pieces."""

    host: str
    distance: int
    """Hops from the announcer (0: the announcer's own profile)."""
    version: int
    """Content digest of the profile's patterns."""
    pieces: int
    """How many profile pieces carry its patterns (0: the profile is empty)."""


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """An offered message: which fragments the announcer holds (None = all)."""

    msg_id: str
    frags: int
    have: int | None
    zdesc: bytes
    copies: int = 0
    """The announcer's copy budget for it (0: none; see ``NodeConfig.copy_budget``)."""


@dataclass(frozen=True, slots=True)
class Announce:
    sender: str
    seq: int
    altruistic: bool
    version: int
    """Version of the sender's own profile."""
    pieces: int
    """Profile pieces of the sender's own profile (0: empty)."""
    relayed: tuple[ProfileRef, ...]
    catalog: tuple[CatalogEntry, ...]
    same_relays: bool = False
    """The relayed references are left out: unchanged since the sender's last full list."""


@dataclass(frozen=True, slots=True)
class Catalog:
    sender: str
    seq: int
    catalog: tuple[CatalogEntry, ...]


@dataclass(frozen=True, slots=True)
class Request:
    sender: str
    target: str
    entries: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
    """(message id, ((first fragment, count), ...))"""


@dataclass(slots=True, init=False)
class Fragment:
    """Not frozen, unlike the other decoded datagrams: mypyc compiles only non-frozen
    dataclasses into native classes, and one is built per fragment received (most of the
    traffic). Treat it as immutable all the same. Its ``__init__`` is written out: the one
    ``dataclass`` generates is not compiled, and ran as interpreted Python (seven
    attribute stores by name) for every fragment received."""

    sender: str
    msg_id: str
    hops: int
    index: int
    zdesc: bytes
    """The compressed descriptor; empty in a fragment by digest."""
    chunk: bytes
    zref: bytes
    """A fragment by digest (``FRAGMENT_BY_DIGEST``): the :func:`descriptor_digest` of the
    descriptor it belongs to, which the receiver must already hold; empty otherwise."""

    def __init__(
        self,
        sender: str,
        msg_id: str,
        hops: int,
        index: int,
        zdesc: bytes,
        chunk: bytes,
        zref: bytes = b"",
    ) -> None:
        self.sender = sender
        self.msg_id = msg_id
        self.hops = hops
        self.index = index
        self.zdesc = zdesc
        self.chunk = chunk
        self.zref = zref


@dataclass(frozen=True, slots=True)
class ProfilePiece:
    """Piece ``index`` of ``count`` of the profile ``(owner, version)``."""

    sender: str
    owner: str
    version: int
    count: int
    index: int
    patterns: PatternSpecs


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    sender: str
    target: str
    entries: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...]
    """(owner, version, ((first piece, count), ...))"""


@dataclass(frozen=True, slots=True)
class Ack:
    """Messages published ``once`` that some host has delivered (see ``dodwan/core/acks.py``)."""

    sender: str
    entries: tuple[tuple[str, int], ...]
    """(message id, whole seconds left until its deadline)"""


Datagram = Announce | Catalog | Request | Fragment | ProfilePiece | ProfileRequest | Ack


# ---------------------------------------------------------------- primitives


_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))
"""The varints below 128 (one byte each): most lengths and counts."""
_BYTE = tuple(bytes((i,)) for i in range(0x100))
_TWO_BYTE_VARINT = tuple(bytes((i & 0x7F | 0x80, i >> 7)) for i in range(0x4000))
"""The varint of each n below 2**14 that takes two bytes (n >= 0x80; a fragment index of
a message of up to ~20 MB), made once rather than per fragment sent."""


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if 0 <= n < 0x4000:
        return _TWO_BYTE_VARINT[n]
    if n < 0:
        raise ValueError("varint must be >= 0")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    n = len(raw)
    return (_ONE_BYTE[n] if n < 0x80 else _varint(n)) + raw


def _blob(b: bytes) -> bytes:
    return _varint(len(b)) + b


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise WireError("truncated")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def u32(self) -> int:
        end = self.pos + 4
        if end > len(self.data):
            raise WireError("truncated")
        v = int.from_bytes(self.data[self.pos : end], "big")
        self.pos = end
        return v

    def varint(self, maximum: int = (1 << 63) - 1) -> int:
        pos = self.pos
        if pos < len(self.data):  # most varints are one byte: read it directly
            b = self.data[pos]
            if b < 0x80:
                if b > maximum:
                    raise WireError("value out of range")
                self.pos = pos + 1
                return b
        shift = 0
        value = 0
        while True:
            b = self.u8()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise WireError("varint too long")
        if value > maximum:
            raise WireError("value out of range")
        return value

    def blob(self, maximum: int) -> bytes:
        return self.fixed(self.varint(maximum))

    def text(self, maximum: int) -> str:
        try:
            return self.blob(maximum).decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("invalid utf-8") from None

    def fixed(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        end = self.pos + n
        if end > len(self.data):
            raise WireError("truncated")
        b = bytes(self.data[self.pos : end])
        self.pos = end
        return b

    def rest(self) -> bytes:
        b = bytes(self.data[self.pos :])
        self.pos = len(self.data)
        return b

    def end(self) -> None:
        if self.pos != len(self.data):
            raise WireError("trailing bytes")


# ---------------------------------------------------------------- descriptors


_ASCII_NAMES: dict[str, str] = {}
"""Attribute names already seen by :func:`encode_attributes`, each with its length byte in
front (a descriptor repeats the same few dozen names); bounded by ``_ASCII_NAMES_MAX``."""
_ASCII_NAMES_MAX = 1024


def encode_attributes(d: Mapping[str, str]) -> bytes:
    """Canonical descriptor encoding: count, then sorted (name, value) pairs.

    Every publication encodes its descriptor, nearly always of ASCII strings shorter than
    128 characters: their encoding is then the text with one length character in front of
    each string (a one-byte varint, the same code point in ASCII), built as one str and
    encoded once. Anything else takes the general path (:func:`_encode_attributes`); both
    give the same bytes."""
    n = len(d)
    if n >= 0x80:
        return _encode_attributes(d)
    names = _ASCII_NAMES
    parts = [chr(n)]
    add = parts.append
    for name in sorted(d):
        prefixed = names.get(name)
        if prefixed is None:
            if len(name) >= 0x80 or not name.isascii():
                return _encode_attributes(d)
            prefixed = chr(len(name)) + name
            if len(names) < _ASCII_NAMES_MAX:
                names[name] = prefixed
        value = d[name]
        if len(value) >= 0x80 or not value.isascii():
            return _encode_attributes(d)
        add(prefixed)
        add(chr(len(value)))
        add(value)
    return "".join(parts).encode("ascii")


def _encode_attributes(d: Mapping[str, str]) -> bytes:
    """:func:`encode_attributes` for any strings (UTF-8, any length, any count)."""
    parts = [_varint(len(d))]
    add = parts.append
    for name in sorted(d):
        for text in (name, d[name]):  # _str inlined: every publication encodes ~50 strings
            raw = text.encode("utf-8")
            n = len(raw)
            add(_ONE_BYTE[n] if n < 0x80 else _varint(n))
            add(raw)
    return b"".join(parts)


def decode_attributes(raw: bytes, limits: Limits) -> dict[str, str]:
    """Inverse of :func:`encode_attributes`. Every catalog entry a peer offers is decoded
    here, so the common case (lengths below 128, one-byte varints) is read inline: the same
    checks in the same order as :class:`_Reader`, at about half the cost."""
    r = _Reader(raw)
    n = r.varint(limits.max_attributes)
    pos, size = r.pos, len(raw)
    limit = (limits.max_attribute_name, limits.max_descriptor_bytes)
    out: dict[str, str] = {}
    pair = ["", ""]
    try:
        for _ in range(n):
            for k in (0, 1):
                if pos >= size:
                    raise WireError("truncated")
                length = raw[pos]
                if length < 0x80:
                    pos += 1
                    if length > limit[k]:
                        raise WireError("value out of range")
                else:
                    r.pos = pos
                    length = r.varint(limit[k])
                    pos = r.pos
                end = pos + length
                if end > size:
                    raise WireError("truncated")
                pair[k] = raw[pos:end].decode("utf-8")
                pos = end
            name = pair[0]
            if not name or name in out:
                raise WireError("bad attribute name")
            out[name] = pair[1]
    except UnicodeDecodeError:
        raise WireError("invalid utf-8") from None
    if pos != size:
        raise WireError("trailing bytes")
    return out


# ---------------------------------------------------------------- encoding


def _header(kind: int, sender: str) -> bytes:
    return MAGIC + bytes((VERSION, kind)) + _str(sender)


def _patterns(patterns: PatternSpecs) -> bytes:
    parts = [bytes((len(patterns),))]
    for items in patterns:
        parts.append(bytes((len(items),)))
        for name, regex in items:
            parts.append(_str(name))
            parts.append(_str(regex))
    return b"".join(parts)


def encode_catalog_entry(entry: CatalogEntry) -> bytes:
    if not 0 <= entry.copies <= ENTRY_MAX_COPIES:
        raise ValueError(f"copy budget out of range: {entry.copies}")
    parts = [_str(entry.msg_id), _varint(entry.frags)]
    copies = entry.copies << ENTRY_COPIES_SHIFT
    if entry.have is None:
        parts.append(bytes((ENTRY_COMPLETE | copies,)))
    else:
        parts.append(bytes((copies,)))
        parts.append(entry.have.to_bytes((entry.frags + 7) // 8, "little"))
    parts.append(_blob(entry.zdesc))
    return b"".join(parts)


def encode_ref(ref: ProfileRef) -> bytes:
    """One relayed profile reference as it appears inside an announcement."""
    return b"".join(
        [
            _str(ref.host),
            bytes((ref.distance,)),
            ref.version.to_bytes(4, "big"),
            _varint(ref.pieces),
        ]
    )


def encode_announce(
    sender: str,
    seq: int,
    altruistic: bool,
    version: int,
    pieces: int,
    relayed: Sequence[ProfileRef | bytes],
    entries: Sequence[bytes],
    same_relays: bool = False,
) -> bytes:
    """An announcement; ``entries`` are encoded catalog entries, ``relayed`` references may
    be given encoded (see :func:`encode_ref`); with ``same_relays`` they are left out."""
    flags = (FLAG_ALTRUISTIC if altruistic else 0) | (FLAG_SAME_RELAYS if same_relays else 0)
    if same_relays:
        relayed = ()
    parts = [
        _header(ANNOUNCE, sender),
        _varint(seq),
        bytes((flags,)),
        version.to_bytes(4, "big"),
        _varint(pieces),
        bytes((len(relayed),)),
    ]
    for ref in relayed:
        parts.append(ref if isinstance(ref, bytes) else encode_ref(ref))
    parts.append(_varint(len(entries)))
    parts.extend(entries)
    return b"".join(parts)


def announce_overhead(sender: str, seq: int, pieces: int) -> int:
    """Bytes of an announcement without relayed references or entries: the length of
    ``encode_announce(sender, seq, ..., pieces, (), ())``, without encoding it."""
    # flags (1), version (4), relayed count (1), entry count 0 (1)
    return len(_header(ANNOUNCE, sender)) + len(_varint(seq)) + 7 + len(_varint(pieces))


def encode_profile_piece(
    sender: str, owner: str, version: int, count: int, index: int, patterns: PatternSpecs
) -> bytes:
    return b"".join(
        [
            _header(PROFILE, sender),
            _str(owner),
            version.to_bytes(4, "big"),
            _varint(count),
            _varint(index),
            _patterns(patterns),
        ]
    )


def profile_piece_overhead(sender: str, owner: str) -> int:
    """Bytes of a profile piece datagram besides its pattern list (upper bound)."""
    return len(_header(PROFILE, sender)) + len(_str(owner)) + 4 + 3 + 3


def patterns_size(patterns: PatternSpecs) -> int:
    """Encoded size of a pattern list."""
    return len(_patterns(patterns))


def encode_profile_request(
    sender: str, target: str, entries: Sequence[tuple[str, int, Sequence[tuple[int, int]]]]
) -> bytes:
    parts = [_header(PROFILE_REQUEST, sender), _str(target), _varint(len(entries))]
    for owner, version, ranges in entries:
        parts.append(_str(owner))
        parts.append(version.to_bytes(4, "big"))
        parts.append(_ranges(ranges))
    return b"".join(parts)


def encode_catalog(sender: str, seq: int, entries: Sequence[bytes]) -> bytes:
    return b"".join([_header(CATALOG, sender), _varint(seq), _varint(len(entries)), *entries])


def encode_acks(sender: str, entries: Sequence[tuple[str, int]], max_datagram: int) -> list[bytes]:
    """Ack datagrams for ``(message id, seconds left until its deadline)`` entries, as many
    per datagram as fit in ``max_datagram`` bytes."""
    head = _header(ACK, sender)
    out: list[bytes] = []
    group: list[bytes] = []
    full = room = max_datagram - len(head) - 1
    for msg_id, ttl in entries:
        item = _str(msg_id) + _varint(ttl)
        if group and (len(item) > room or len(group) >= 127):
            out.append(b"".join([head, _varint(len(group)), *group]))
            group, room = [], full
        group.append(item)
        room -= len(item)
    if group:
        out.append(b"".join([head, _varint(len(group)), *group]))
    return out


def catalog_overhead(sender: str) -> int:
    """Bytes of a catalog datagram around its entries (upper bound)."""
    return len(_header(CATALOG, sender)) + 10 + 5


def encode_request(
    sender: str, target: str, entries: Sequence[tuple[str, Sequence[tuple[int, int]]]]
) -> bytes:
    parts = [_header(REQUEST, sender), _str(target), _varint(len(entries))]
    for msg_id, ranges in entries:
        parts.append(_str(msg_id))
        parts.append(_ranges(ranges))
    return b"".join(parts)


def encode_fragment(
    sender: str, msg_id: str, hops: int, index: int, zdesc: bytes, chunk: bytes
) -> bytes:
    prefix, suffix = fragment_encoder(sender, msg_id, zdesc)
    return encode_fragment_fast(prefix, suffix, hops, index, chunk)


def descriptor_digest(zdesc: bytes) -> bytes:
    """What a fragment by digest carries instead of the compressed descriptor ``zdesc``."""
    return hashlib.blake2b(zdesc, digest_size=DESCRIPTOR_DIGEST_SIZE).digest()


def fragment_encoder(
    sender: str, msg_id: str, zdesc: bytes, by_digest: bool = False
) -> tuple[bytes, bytes]:
    """The parts of a message's fragment datagrams that do not change between fragments:
    ``prefix + bytes((hops,)) + varint(index) + suffix + chunk`` equals
    :func:`encode_fragment` (``by_digest``: :func:`encode_fragment_by_digest`)."""
    if by_digest:
        return _header(FRAGMENT_BY_DIGEST, sender) + _str(msg_id), descriptor_digest(zdesc)
    return _header(FRAGMENT, sender) + _str(msg_id), _blob(zdesc)


def encode_fragment_by_digest(
    sender: str, msg_id: str, hops: int, index: int, zdesc: bytes, chunk: bytes
) -> bytes:
    """A fragment naming its descriptor by digest rather than carrying it."""
    prefix, suffix = fragment_encoder(sender, msg_id, zdesc, by_digest=True)
    return encode_fragment_fast(prefix, suffix, hops, index, chunk)


def encode_fragment_fast(
    prefix: bytes, suffix: bytes, hops: int, index: int, chunk: bytes
) -> bytes:
    """One fragment datagram from the parts :func:`fragment_encoder` made once per message."""
    if index < 0x80:
        idx = _ONE_BYTE[index]
    elif index < 0x4000:
        idx = _TWO_BYTE_VARINT[index]
    else:
        idx = _varint(index)
    return b"".join((prefix, _BYTE[hops if hops < 255 else 255], idx, suffix, chunk))


def fragment_overhead(sender: str, msg_id: str, zdesc_len: int) -> int:
    """Bytes of a fragment datagram besides its chunk (index varint counted at its widest)."""
    return (
        len(_header(FRAGMENT, sender))
        + len(_str(msg_id))
        + 1
        + 5
        + len(_varint(zdesc_len))
        + zdesc_len
    )


# ---------------------------------------------------------------- decoding


def _decode_patterns(r: _Reader, limits: Limits) -> PatternSpecs:
    n = r.u8()
    if n > limits.max_patterns:
        raise WireError("too many patterns")
    out = []
    for _ in range(n):
        k = r.u8()
        if not 1 <= k <= limits.max_pattern_attributes:
            raise WireError("bad pattern size")
        items = []
        for _ in range(k):
            name = r.text(limits.max_attribute_name)
            regex = r.text(limits.max_regex_length * 4)
            if len(regex) > limits.max_regex_length:
                raise WireError("regex too long")
            items.append((name, regex))
        out.append(tuple(sorted(items)))
    return tuple(out)


def _decode_ranges(r: _Reader, bound: int) -> tuple[tuple[int, int], ...]:
    """``varint count`` then that many (``varint first``, ``varint count``), each <= bound."""
    return tuple((r.varint(bound), r.varint(bound)) for _ in range(r.varint(bound)))


def _ranges(ranges: Sequence[tuple[int, int]]) -> bytes:
    return b"".join([_varint(len(ranges)), *(_varint(f) + _varint(c) for f, c in ranges)])


def _decode_entries(r: _Reader, limits: Limits) -> tuple[CatalogEntry, ...]:
    n = r.varint(limits.max_catalog_entries)
    out = []
    for _ in range(n):
        msg_id = r.text(MAX_MSG_ID)
        frags = r.varint(limits.max_fragments)
        if frags < 1:
            raise WireError("bad fragment count")
        flags = r.u8()
        have: int | None = None
        if not flags & ENTRY_COMPLETE:
            nbytes = (frags + 7) // 8
            end = r.pos + nbytes
            if end > len(r.data):
                raise WireError("truncated")
            have = int.from_bytes(r.data[r.pos : end], "little")
            r.pos = end
            if have >> frags:
                raise WireError("bitmap beyond fragment count")
        zdesc = r.blob(limits.max_descriptor_bytes)
        out.append(CatalogEntry(msg_id, frags, have, zdesc, flags >> ENTRY_COPIES_SHIFT))
    return tuple(out)


def _decode_fragment(data: bytes, limits: Limits) -> Fragment:
    """Fragments are most of the traffic: decoded inline when every length and the index
    take at most two varint bytes (fragment indexes below 16,384: messages of up to ~20 MB
    with 1400-byte datagrams); anything else, malformed input included, goes through
    :func:`_decode_fragment_general`."""
    try:
        n = data[4]
        p = 5 + n
        k = data[p]
        if n >= 0x80 or k >= 0x80 or n > MAX_HOST_ID or k > MAX_MSG_ID:
            return _decode_fragment_general(data, limits)
        q = p + 1 + k
        hops = data[q]
        index, q = _short_varint(data, q + 1)
        if index < 0:
            return _decode_fragment_general(data, limits)
        by_digest = data[3] == FRAGMENT_BY_DIGEST
        if by_digest:
            z = DESCRIPTOR_DIGEST_SIZE
        else:
            z, q = _short_varint(data, q)
            if z < 0:
                return _decode_fragment_general(data, limits)
    except IndexError:
        return _decode_fragment_general(data, limits)
    end = q + z
    if index > limits.max_fragments or z > limits.max_descriptor_bytes or end >= len(data):
        return _decode_fragment_general(data, limits)
    try:
        sender = data[5:p].decode("utf-8")
        msg_id = data[p + 1 : p + 1 + k].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("invalid utf-8") from None
    if not sender:
        raise WireError("empty sender")
    if by_digest:
        return Fragment(sender, msg_id, hops, index, b"", data[end:], data[q:end])
    return Fragment(sender, msg_id, hops, index, data[q:end], data[end:])


def _short_varint(data: bytes, q: int) -> tuple[int, int]:
    """The varint at ``q`` and the position after it, if it takes one or two bytes;
    ``(-1, q)`` if it takes more (IndexError past the end)."""
    v = data[q]
    if v < 0x80:
        return v, q + 1
    b = data[q + 1]
    if b >= 0x80:
        return -1, q
    return (v & 0x7F) | b << 7, q + 2


def _decode_fragment_general(data: bytes, limits: Limits) -> Fragment:
    """Any fragment, with the generic reader (long fields, and the errors of bad input)."""
    r = _Reader(data, 4)
    sender = r.text(MAX_HOST_ID)
    msg_id = r.text(MAX_MSG_ID)
    hops = r.u8()
    index = r.varint(limits.max_fragments)
    by_digest = data[3] == FRAGMENT_BY_DIGEST
    if by_digest:
        zdesc, zref = b"", r.fixed(DESCRIPTOR_DIGEST_SIZE)
    else:
        zdesc, zref = r.blob(limits.max_descriptor_bytes), b""
    if not sender:
        raise WireError("empty sender")
    chunk = r.rest()
    if not chunk:
        raise WireError("empty fragment")
    return Fragment(sender, msg_id, hops, index, zdesc, chunk, zref)


@functools.lru_cache(maxsize=256)
def decode_cached(data: bytes, limits: Limits) -> Datagram:
    """:func:`decode`, remembering recent results: a broadcast heard by many hosts of one
    process (the simulator) is decoded once. Decoded datagrams are immutable."""
    return decode(data, limits)


def decode(data: bytes, limits: Limits) -> Datagram:
    """Decode one datagram; raise WireError for anything malformed or out of bounds."""
    if len(data) < 5 or data[:2] != MAGIC:
        raise WireError("foreign")
    if data[2] != VERSION:
        raise WireError("version")
    kind = data[3]
    if kind in FRAGMENT_KINDS:
        return _decode_fragment(data, limits)
    r = _Reader(data, 4)
    sender = r.text(MAX_HOST_ID)
    if not sender:
        raise WireError("empty sender")
    if kind == ANNOUNCE:
        seq = r.varint()
        flags = r.u8()
        version = r.u32()
        pieces = r.varint(limits.max_profile_pieces)
        nrel = r.u8()
        if nrel > limits.max_relayed_profiles:
            raise WireError("too many relayed profiles")
        relayed = []
        for _ in range(nrel):
            host = r.text(MAX_HOST_ID)
            distance = r.u8()
            rversion = r.u32()
            relayed.append(
                ProfileRef(host, distance, rversion, r.varint(limits.max_profile_pieces))
            )
        entries = _decode_entries(r, limits)
        r.end()
        return Announce(
            sender,
            seq,
            bool(flags & FLAG_ALTRUISTIC),
            version,
            pieces,
            tuple(relayed),
            entries,
            bool(flags & FLAG_SAME_RELAYS),
        )
    if kind == PROFILE:
        owner = r.text(MAX_HOST_ID)
        version = r.u32()
        count = r.varint(limits.max_profile_pieces)
        index = r.varint(limits.max_profile_pieces)
        if not owner or index >= count:
            raise WireError("bad profile piece")
        patterns = _decode_patterns(r, limits)
        r.end()
        return ProfilePiece(sender, owner, version, count, index, patterns)
    if kind == PROFILE_REQUEST:
        target = r.text(MAX_HOST_ID)
        n = r.varint(limits.max_request_entries)
        preq = []
        for _ in range(n):
            owner = r.text(MAX_HOST_ID)
            version = r.u32()
            preq.append((owner, version, _decode_ranges(r, limits.max_profile_pieces)))
        r.end()
        return ProfileRequest(sender, target, tuple(preq))
    if kind == CATALOG:
        seq = r.varint()
        entries = _decode_entries(r, limits)
        r.end()
        return Catalog(sender, seq, entries)
    if kind == ACK:
        n = r.varint(limits.max_catalog_entries)
        acks = tuple((r.text(MAX_MSG_ID), r.varint()) for _ in range(n))
        if not n or not all(msg_id for msg_id, _ in acks):
            raise WireError("bad ack")
        r.end()
        return Ack(sender, acks)
    if kind == REQUEST:
        target = r.text(MAX_HOST_ID)
        n = r.varint(limits.max_request_entries)
        req = []
        for _ in range(n):
            msg_id = r.text(MAX_MSG_ID)
            req.append((msg_id, _decode_ranges(r, limits.max_fragments)))
        r.end()
        return Request(sender, target, tuple(req))
    raise WireError("unknown kind")  # fragments were decoded above
