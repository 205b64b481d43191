"""Rate budgets for work peers make a node do: one token bucket per source address, and one
for all sources together.

Sender names are free (a datagram says who sent it), source addresses much less so: one
socket has one. Work a peer can trigger at will (decoding descriptors it offers, fragments it
asks for) is charged to the address it came from *and* to the node's total, so a crowd of
names behind one socket gets one share, and a crowd of sockets cannot take more than the
total. Buckets start full (one second's worth) and refill at their rate.
"""

from __future__ import annotations

from collections.abc import Hashable


class RateBudget:
    """``per_source`` and ``total`` tokens per second, each bucket holding at most
    ``window`` seconds' worth (and starting full); at most ``max_sources`` buckets kept
    (past that, the oldest half is forgotten: a forgotten source starts full again, which
    the total still bounds)."""

    __slots__ = ("_at", "_buckets", "_tokens", "max_sources", "per_source", "total", "window")

    def __init__(
        self, per_source: float, total: float, max_sources: int, window: float = 1.0
    ) -> None:
        self.per_source = per_source
        self.total = total
        self.max_sources = max_sources
        self.window = window
        self._buckets: dict[Hashable, list[float]] = {}
        self._tokens = total * window
        self._at: float | None = None

    @property
    def capacity(self) -> float:
        """The most one source can ever spend at once."""
        return min(self.per_source, self.total) * self.window

    def available(self, source: Hashable, now: float) -> float:
        """Tokens ``source`` may spend now (refilled to ``now``): the lower of its own
        bucket and the total's."""
        if self._at is None:
            self._at = now
        elif now > self._at:
            cap = self.total * self.window
            self._tokens = min(cap, self._tokens + (now - self._at) * self.total)
            self._at = now
        b = self._buckets.get(source)
        if b is None:
            if len(self._buckets) >= self.max_sources:
                for k in list(self._buckets)[: len(self._buckets) // 2]:
                    del self._buckets[k]
            b = self._buckets[source] = [self.per_source * self.window, now]
        elif now > b[1]:
            b[0] = min(self.per_source * self.window, b[0] + (now - b[1]) * self.per_source)
            b[1] = now
        return min(b[0], self._tokens)

    def spend(self, source: Hashable, n: float) -> None:
        """Charge ``n`` tokens to ``source`` and to the total (after :meth:`available`)."""
        b = self._buckets.get(source)
        if b is not None:
            b[0] -= n
        self._tokens -= n

    def take(self, source: Hashable, now: float) -> bool:
        """Spend one token if ``source`` has one; False (nothing spent) otherwise."""
        if self.available(source, now) < 1:
            return False
        self.spend(source, 1)
        return True
