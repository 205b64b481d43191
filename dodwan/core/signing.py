"""Origin signatures: Ed25519 over the canonical descriptor encoding.

The descriptor holds the payload's digest (``zhash``), so signing the descriptor signs the
whole message. ``sigkey`` names the signer's public key (hex); ``sig`` is the signature
(hex) over every other attribute. A descriptor that carries either attribute must verify,
or it is dropped: a carrier can neither alter a signed message nor strip a signature and
pass the message off as signed.
"""

from __future__ import annotations

from collections.abc import Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from . import wire
from .errors import WireError
from .message import SIG, SIGKEY


class Signer:
    """Signs descriptors with one private key."""

    def __init__(self, private_key: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(private_key)
        self.public_hex: str = (
            self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
        )

    def sign(self, descriptor: dict[str, str]) -> None:
        """Add ``sigkey`` and ``sig`` to ``descriptor`` (in place)."""
        descriptor.pop(SIG, None)
        descriptor[SIGKEY] = self.public_hex
        descriptor[SIG] = self._key.sign(wire.encode_attributes(descriptor)).hex()


def public_key_of(private_key: bytes) -> str:
    """Hex public key for a raw private key."""
    return Signer(private_key).public_hex


def verify(descriptor: Mapping[str, str]) -> None:
    """Raise WireError unless the descriptor is unsigned or correctly signed."""
    sig = descriptor.get(SIG)
    key = descriptor.get(SIGKEY)
    if sig is None and key is None:
        return
    if sig is None or key is None:
        raise WireError("bad signature")
    unsigned = {k: v for k, v in descriptor.items() if k != SIG}
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)).verify(
            bytes.fromhex(sig), wire.encode_attributes(unsigned)
        )
    except (ValueError, InvalidSignature):
        raise WireError("bad signature") from None
