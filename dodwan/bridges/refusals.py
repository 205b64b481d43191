"""Messages a broker refuses: found, held back and tried again later, never lost.

A broker may refuse one message of a batch (ActiveMQ: a STOMP header over its 10240-byte
limit) by failing the whole transaction. Sending the batch again would fail again, for
ever, and the messages behind it would never go. So the messages of a refused batch are
*suspects*: each is sent alone until they have all gone or failed. One refused alone is
*held*: it stays in the outbox (unsent, in the backlog) while the others go, and is tried
again after a delay that doubles (a refusal that may pass: access rights granted later),
until it goes or its deadline passes. The state lives in memory: after a restart a held
message is found again the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

RETRY_MIN = 60.0
"""Seconds before a message refused alone is tried again (doubling)."""
RETRY_MAX = 3600.0
DROPS = 3
"""Connections lost, unexplained, right after a message was sent alone, in a row, that make
it refused (a network cut may do it once; a broker closing on that message every time)."""

R = TypeVar("R")


class Refusals:
    """The refused messages of one binding, by outbox sequence number."""

    def __init__(self) -> None:
        self.suspects: set[int] = set()
        self.held: dict[int, tuple[float, float]] = {}
        """seq -> (when to try it again, the delay that gave it)."""
        self.strikes = 0
        """Refusals since the broker last took a batch (the reconnection back-off)."""
        self.drops: dict[int, int] = {}
        """seq -> connections lost in a row while it was sent alone (see :meth:`dropped`)."""

    def withheld(self, now: float) -> list[int]:
        """The held messages not to send now; those due are sent alone again."""
        out = []
        for seq, (at, _delay) in self.held.items():
            if at > now:
                out.append(seq)
            else:
                self.suspects.add(seq)
        return out

    def batch(self, rows: Sequence[R], seqs: Sequence[int]) -> Sequence[R]:
        """The part of ``rows`` (pending, in order; their ``seqs``) to send: a suspect
        alone, else the rows before the first suspect."""
        if not self.suspects:
            return rows
        # A suspect before the first pending row has gone (sent, echoed or expired): a
        # held one due again is a suspect, so it is forgotten here too.
        first = seqs[0] if seqs else math.inf
        gone = {s for s in self.suspects if s < first}
        self.suspects -= gone
        for seq in gone:
            self.held.pop(seq, None)
        for i, seq in enumerate(seqs):
            if seq in self.suspects:
                return rows[: max(i, 1)]
        return rows

    def sent(self, seqs: Sequence[int]) -> None:
        for seq in seqs:
            self.suspects.discard(seq)
            self.held.pop(seq, None)
            self.drops.pop(seq, None)
        self.strikes = 0

    def dropped(self, seqs: Sequence[int], now: float) -> None:
        """The connection was lost, unexplained, while these were sent (a cut, or a broker
        that refuses one of them by closing the connection): they are sent alone, and one
        lost :data:`DROPS` times in a row alone is refused."""
        if len(seqs) != 1:
            self.strikes += 1
            self.suspects.update(seqs)
            return
        (seq,) = seqs
        n = self.drops.get(seq, 0) + 1
        if n < DROPS:
            self.strikes += 1
            self.drops[seq] = n
            self.suspects.add(seq)
            return
        self.drops.pop(seq, None)
        self.refused(seqs, now)

    def refused(self, seqs: Sequence[int], now: float) -> None:
        """The broker refused the batch of these messages."""
        self.strikes += 1
        if len(seqs) != 1:
            self.suspects.update(seqs)
            return
        (seq,) = seqs
        self.suspects.discard(seq)
        self.drops.pop(seq, None)
        delay = min(RETRY_MAX, 2 * self.held[seq][1]) if seq in self.held else RETRY_MIN
        self.held[seq] = (now + delay, delay)
