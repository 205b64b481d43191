"""Messages: descriptor attributes, compression, fragmentation and reassembly.

A message is a *descriptor* (str -> str attributes, always with ``id`` and ``deadline``) and
an opaque *payload*. Publishing compresses both with zstd and cuts the compressed payload
into fragments that each fit one datagram together with the compressed descriptor, so
fragments travel independently. Reassembly checks the declared sizes and a digest before
inflating anything: a decompression bomb is refused before it allocates.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import zstandard

from . import wire
from .errors import WireError
from .limits import Limits

# System attributes: set by the core, never by applications (except ``id``).
ID = "id"
DEADLINE = "deadline"
ORIGIN = "origin"
DATE = "date"
SIZE = "size"
PRIORITY = "priority"
PERSISTENT = "persistent"
ZSIZE = "zsize"
FRAGS = "frags"
FSIZE = "fsize"
ZHASH = "zhash"
SIGKEY = "sigkey"
SIG = "sig"
SYSTEM_ATTRIBUTES = frozenset(
    {
        ID,
        DEADLINE,
        ORIGIN,
        DATE,
        SIZE,
        PRIORITY,
        PERSISTENT,
        ZSIZE,
        FRAGS,
        FSIZE,
        ZHASH,
        SIGKEY,
        SIG,
    }
)
APP_SETTABLE = frozenset({ID})

ONCE = "once"
"""Optional attribute an application may set to ``"true"``: the message is done once one
host has delivered it. That host acknowledges it and the acknowledgement purges the
copies carried for others (see ``dodwan/core/acks.py``); ``"false"`` or absent: every
subscriber may get it."""
_BOOLEANS = {"true": True, "false": False}

MAX_ID_LENGTH = 128

_DECOMPRESSOR = zstandard.ZstdDecompressor()


def format_time(t: float) -> str:
    """Times in descriptors: decimal seconds, shortest exact form."""
    return repr(float(t))


def check_message_id(msg_id: str) -> None:
    """Raise ValueError unless ``msg_id`` is 1..128 printable characters without spaces."""
    if not isinstance(msg_id, str):
        raise TypeError("message id must be a str")
    # the only whitespace character str.isprintable() lets through is the space
    # (tests/test_core_wire.py checks every code point)
    if not 1 <= len(msg_id) <= MAX_ID_LENGTH or not msg_id.isprintable() or " " in msg_id:
        raise ValueError(
            f"message id must be 1-{MAX_ID_LENGTH} printable characters without spaces"
        )


def check_app_attributes(attributes: Mapping[str, str], limits: Limits) -> None:
    """Validate attributes given by a local publisher; raise TypeError/ValueError."""
    if not isinstance(attributes, Mapping):
        raise TypeError("descriptor attributes must be a mapping of str -> str")
    if len(attributes) + len(SYSTEM_ATTRIBUTES) > limits.max_attributes:
        raise ValueError(
            f"too many attributes: at most {limits.max_attributes - len(SYSTEM_ATTRIBUTES)} "
            f"besides the system ones (limits.max_attributes: {limits.max_attributes})"
        )
    for name, value in attributes.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(
                f"descriptor attributes must be str -> str, got {name!r}: {type(value).__name__}"
            )
        if not name or len(name) > limits.max_attribute_name:
            raise ValueError(f"bad attribute name {name!r}")
        if name in SYSTEM_ATTRIBUTES and name not in APP_SETTABLE:
            raise ValueError(f"attribute {name!r} is set by DoDWAN and cannot be given")
        if name == ONCE and value not in _BOOLEANS:
            raise ValueError(f'attribute "once" must be "true" or "false", got {value!r}')


@dataclass(frozen=True, slots=True)
class Header:
    """The parts of a descriptor the core relies on, parsed and validated once."""

    msg_id: str
    deadline: float
    origin: str
    date: float
    size: int
    zsize: int
    frags: int
    fsize: int
    zhash: str
    priority: int
    persistent: bool
    once: bool = False
    """Done once one host has delivered it (attribute ``once``)."""

    @classmethod
    def parse(cls, d: Mapping[str, str], limits: Limits) -> Header:
        """Validate the system attributes; raise WireError on anything inconsistent."""
        try:
            h = cls(
                msg_id=d[ID],
                deadline=float(d[DEADLINE]),
                origin=d[ORIGIN],
                date=float(d[DATE]),
                size=int(d[SIZE]),
                zsize=int(d[ZSIZE]),
                frags=int(d[FRAGS]),
                fsize=int(d[FSIZE]),
                zhash=d[ZHASH],
                priority=int(d[PRIORITY]),
                persistent=d[PERSISTENT] == "true",
                once=_BOOLEANS[d.get(ONCE, "false")],
            )
        except (KeyError, ValueError) as exc:
            raise WireError(f"bad descriptor: {exc}") from None
        if not h.msg_id or len(h.msg_id) > MAX_ID_LENGTH:
            raise WireError("bad message id")
        if not (
            0 <= h.size <= limits.max_message_size and 0 < h.zsize <= limits.max_message_size + 1024
        ):
            raise WireError("declared size out of bounds")
        if not 1 <= h.frags <= limits.max_fragments or h.fsize <= 0:
            raise WireError("fragment count out of bounds")
        if (h.zsize + h.fsize - 1) // h.fsize != h.frags:
            raise WireError("fragment geometry inconsistent")
        if not 0 <= h.priority <= 9:
            raise WireError("priority out of bounds")
        if not (math.isfinite(h.deadline) and math.isfinite(h.date)):  # NaN, inf, 1e999
            raise WireError("bad time")
        return h

    def fragment_length(self, index: int) -> int:
        """Length of fragment ``index`` of the compressed payload."""
        if index < self.frags - 1:
            return self.fsize
        return self.zsize - self.fsize * (self.frags - 1)


_COMPRESSORS: dict[int, zstandard.ZstdCompressor] = {}


def compressor(level: int) -> zstandard.ZstdCompressor:
    """A shared compressor per level (creating one costs more than compressing a descriptor)."""
    c = _COMPRESSORS.get(level)
    if c is None:
        c = _COMPRESSORS[level] = zstandard.ZstdCompressor(level=level)
    return c


def compress_descriptor(d: Mapping[str, str], level: int = 3) -> bytes:
    """Canonical encoding (sorted attributes), zstd-compressed with its content size."""
    return compressor(level).compress(wire.encode_attributes(d))


def decompress_descriptor(data: bytes, limits: Limits) -> dict[str, str]:
    """Inflate and decode a descriptor; WireError when it is malformed or too large."""
    declared = _declared_size(data)
    if declared > limits.max_descriptor_bytes:
        raise WireError("descriptor too large")
    raw = _inflate(data, declared)
    return wire.decode_attributes(raw, limits)


def _declared_size(data: bytes) -> int:
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise WireError("not a zstd frame") from None
    if declared < 0:
        raise WireError("zstd frame without content size")
    return int(declared)


def _inflate(data: bytes, declared: int) -> bytes:
    try:
        raw = _DECOMPRESSOR.decompress(data, max_output_size=declared)
    except zstandard.ZstdError:
        raise WireError("corrupt zstd frame") from None
    if len(raw) != declared:
        raise WireError("inflated size differs from declared size")
    return bytes(raw)


def payload_digest(zpayload: bytes) -> str:
    """Digest of the compressed payload, checked after reassembly."""
    return hashlib.blake2b(zpayload, digest_size=16).hexdigest()


def verify_payload(zpayload: bytes, header: Header) -> None:
    """Check length, digest and the frame's declared size; WireError when any disagrees."""
    if len(zpayload) != header.zsize or payload_digest(zpayload) != header.zhash:
        raise WireError("payload digest mismatch")
    if _declared_size(zpayload) != header.size:
        raise WireError("payload declares another size")


_FRAME_HEADER_MAX = 18
"""Bytes of a zstd frame's header at most (where it declares the content size)."""


def verify_chunks(chunks: Sequence[bytes], header: Header) -> None:
    """:func:`verify_payload` of ``b"".join(chunks)``, without joining them: a carrier that
    completes a message it does not deliver here never needs it in one piece."""
    h = hashlib.blake2b(digest_size=16)
    n = 0
    for chunk in chunks:
        h.update(chunk)
        n += len(chunk)
    if n != header.zsize or h.hexdigest() != header.zhash:
        raise WireError("payload digest mismatch")
    head = b""
    for chunk in chunks:
        head += chunk[: _FRAME_HEADER_MAX - len(head)]
        if len(head) >= _FRAME_HEADER_MAX:
            break
    if _declared_size(head) != header.size:
        raise WireError("payload declares another size")


class VerifiedPayloads:
    """Payloads :func:`verify_chunks` accepted lately, for the nodes of one process to share
    (the simulator's hosts, which complete the same messages over and over): a copy whose
    chunks equal, byte for byte, those of a copy accepted under the same size and digest
    fields gets the same verdict without being hashed again. Comparing bytes costs a
    fraction of BLAKE2b. The chunks of the copies held stay alive: at most ``max_bytes``
    of them, the least recently used going first."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._held: dict[tuple[str, int, int], list[bytes]] = {}
        self._bytes = 0
        self.hits = 0
        """Verdicts given by comparing with a copy held rather than by hashing."""

    def verify(self, chunks: Sequence[bytes], header: Header) -> None:
        """:func:`verify_chunks`, or the same verdict from an equal copy accepted before."""
        key = (header.zhash, header.zsize, header.size)
        held = self._held.get(key)
        if (
            held is not None
            and len(held) == len(chunks)
            and all(a == b for a, b in zip(held, chunks, strict=True))
        ):
            self.hits += 1
            del self._held[key]
            self._held[key] = held  # most recently used last
            return
        verify_chunks(chunks, header)  # raises for a copy that does not match its header
        if held is not None:  # another copy under these fields passed: this one replaces it
            del self._held[key]
            self._bytes -= key[1]
        self._keep(key, list(chunks))

    def _keep(self, key: tuple[str, int, int], chunks: list[bytes]) -> None:
        if key[1] > self.max_bytes:
            return
        held = self._held
        held[key] = chunks
        self._bytes += key[1]
        while self._bytes > self.max_bytes:
            oldest = next(iter(held))
            del held[oldest]
            self._bytes -= oldest[1]


def inflate_payload(zpayload: bytes, header: Header, verified: bool = False) -> bytes:
    """Inflate a reassembled payload (verifying it first unless ``verified``)."""
    if not verified:
        verify_payload(zpayload, header)
    return _inflate(zpayload, header.size)


def fragment_room(max_datagram: int, host_id: str, msg_id: str, zdesc_len: int) -> int:
    """Payload bytes that fit in one fragment datagram next to the compressed descriptor."""
    return max_datagram - wire.fragment_overhead(host_id, msg_id, zdesc_len)
