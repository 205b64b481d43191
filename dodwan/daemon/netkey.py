"""The optional network key: every datagram sealed with a pre-shared key, replays refused.

Only hosts holding the key take part: a datagram without a valid tag is dropped before the
core sees it. The key file holds 32 random bytes (base64 or hex); ``dodwan keygen FILE``
writes one readable by its owner only.

Wrapped datagram (``docs/security.md``)::

    magic "DK" (2) | mode (1: 0 auth, 1 encrypt) | key id (4) | boot id (8) | counter (8)
    | body | tag (16)

``key id`` is the first bytes of SHA-256 over the key (a cheap "wrong network" check).
Each process draws a random 8-byte ``boot id`` and numbers its datagrams with ``counter``;
the ChaCha20-Poly1305 key of a sender is derived from the network key and its boot id
(HMAC-SHA256), so nonces (the counter) are never reused under one key. In ``encrypt`` mode
the body is the ciphertext and the header is authenticated data; in ``auth`` mode the body
is the datagram in clear and header + body are authenticated data.

Replay protection: per sender boot id, the highest counter seen and a window of
:data:`WINDOW` counters below it; an older or already seen counter is refused. At most
:data:`MAX_SENDERS` boot ids are remembered (least recently heard forgotten first); the
state lives in memory, so it protects a receiver for its own lifetime.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import struct
from collections import OrderedDict
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

MAGIC = b"DK"
MODES = {"auth": 0, "encrypt": 1}
KEY_BYTES = 32
TAG_BYTES = 16
WINDOW = 1024
"""Counters below the highest one seen that are still accepted (once each)."""
MAX_SENDERS = 4096
"""Sender boot ids whose replay state is kept."""

_HEADER = struct.Struct("!2sB4s8sQ")
HEADER_BYTES = _HEADER.size
OVERHEAD = HEADER_BYTES + TAG_BYTES
"""Bytes a sealed datagram adds to the core's datagram."""


class NetKeyError(ValueError):
    """The key file is missing, unreadable or malformed (message fit for one line)."""


def generate_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def parse_key(text: str) -> bytes:
    """32 bytes from base64 (44 characters) or hex (64 characters) text."""
    text = text.strip()
    raw: bytes | None = None
    if len(text) == 2 * KEY_BYTES:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = None
    if raw is None:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raw = None
    if raw is None or len(raw) != KEY_BYTES:
        raise NetKeyError(f"a key is {KEY_BYTES} bytes written in base64 or hex")
    return raw


def read_key_file(path: str | Path) -> bytes:
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        raise NetKeyError(f"key file {path} does not exist") from None
    except OSError as exc:
        raise NetKeyError(f"cannot read key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise NetKeyError(f"key file {path} is not a base64 or hex key") from None
    try:
        return parse_key(text)
    except NetKeyError as exc:
        raise NetKeyError(f"key file {path}: {exc}") from None


def write_secret_file(path: str | Path, text: str, force: bool = False) -> None:
    """Write ``text`` to a new file of mode 0600; an existing file only with ``force``."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; use --force to replace it")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"dodwan network key id\x00" + key).digest()[:4]


class _Replay:
    """Highest counter and a bitmap of the :data:`WINDOW` counters below it."""

    __slots__ = ("aead", "bitmap", "top")

    def __init__(self, aead: ChaCha20Poly1305) -> None:
        self.aead = aead
        self.top = -1
        self.bitmap = 0  # bit i: counter top - i seen

    def fresh(self, counter: int) -> bool:
        if counter > self.top:
            return True
        age = self.top - counter
        return age < WINDOW and not (self.bitmap >> age) & 1

    def mark(self, counter: int) -> None:
        if counter > self.top:
            shift = counter - self.top
            # a jump past the window forgets it whole: O(1) whatever the jump (a sealed
            # datagram whose counter leapt to 2**62 used to shift the bitmap that far)
            if shift >= WINDOW:
                self.bitmap = 1
            else:
                self.bitmap = ((self.bitmap << shift) | 1) & ((1 << WINDOW) - 1)
            self.top = counter
        else:
            self.bitmap |= 1 << (self.top - counter)


class NetKey:
    """Seals outgoing datagrams and opens incoming ones; counts what it refuses."""

    def __init__(self, key: bytes, mode: str = "encrypt", max_senders: int = MAX_SENDERS) -> None:
        if len(key) != KEY_BYTES:
            raise NetKeyError(f"a network key is {KEY_BYTES} bytes")
        if mode not in MODES:
            raise NetKeyError("network_key_mode must be auth or encrypt")
        self._key = key
        self._id = key_id(key)
        self.mode = mode
        self._mode_byte = MODES[mode]
        self._boot = secrets.token_bytes(8)
        self._counter = 0
        self._aead = self._derive(self._boot)
        self._senders: OrderedDict[bytes, _Replay] = OrderedDict()
        self._max_senders = max_senders
        self.rejected = 0
        """Datagrams without the header, with another key id, or whose tag did not verify."""
        self.replayed = 0
        """Authentic datagrams refused as old or already seen."""

    def _derive(self, boot: bytes) -> ChaCha20Poly1305:
        return ChaCha20Poly1305(hmac.new(self._key, b"dodwan boot\x00" + boot, "sha256").digest())

    @staticmethod
    def _nonce(counter: int) -> bytes:
        return b"\x00\x00\x00\x00" + counter.to_bytes(8, "big")

    def seal(self, data: bytes) -> bytes:
        self._counter += 1
        counter = self._counter
        header = _HEADER.pack(MAGIC, self._mode_byte, self._id, self._boot, counter)
        if self._mode_byte:
            return header + self._aead.encrypt(self._nonce(counter), data, header)
        return header + data + self._aead.encrypt(self._nonce(counter), b"", header + data)

    def open(self, data: bytes) -> bytes | None:
        """The core's datagram, or None (counted) when it is not authentic or is a replay."""
        if len(data) < OVERHEAD:
            self.rejected += 1
            return None
        magic, mode, kid, boot, counter = _HEADER.unpack_from(data)
        if magic != MAGIC or mode not in (0, 1) or not hmac.compare_digest(kid, self._id):
            self.rejected += 1
            return None
        state = self._senders.get(boot)
        aead = state.aead if state is not None else self._derive(boot)
        if state is not None and not state.fresh(counter):
            self.replayed += 1
            return None
        header = data[:HEADER_BYTES]
        nonce = self._nonce(counter)
        try:
            if mode:
                plain = aead.decrypt(nonce, data[HEADER_BYTES:], header)
            else:
                body = data[HEADER_BYTES:-TAG_BYTES]
                aead.decrypt(nonce, data[-TAG_BYTES:], header + body)
                plain = body
        except InvalidTag:
            self.rejected += 1
            return None
        if state is None:
            state = _Replay(aead)
            self._senders[boot] = state
            if len(self._senders) > self._max_senders:
                self._senders.popitem(last=False)
        else:
            self._senders.move_to_end(boot)
        state.mark(counter)
        return plain

    @property
    def senders(self) -> int:
        return len(self._senders)
