"""Error families of the core.

Misuse by the local caller raises ``ValueError``/``TypeError`` (from the standard library).
Bad bytes from a peer raise :class:`WireError` inside the decoder; the node catches it,
counts and traces it, and never lets it escape ``receive_datagram``.
"""


class WireError(Exception):
    """A datagram that cannot be decoded or violates a limit; carries a short reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
