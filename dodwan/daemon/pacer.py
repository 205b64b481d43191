"""Token-bucket pacing of outgoing datagrams (a radio has a bit rate; loopback does not).

:class:`Pacer` queues datagrams and releases them no faster than ``bitrate`` bits per second
with bursts up to ``burst`` bytes. ``bitrate=0`` means unlimited: datagrams go out at once.
The clock is injected (``now`` arguments) so the bucket is testable without sleeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class TokenBucket:
    """``rate`` bytes per second, at most ``burst`` bytes saved up."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def take(self, n: int, now: float) -> bool:
        """Spend ``n`` bytes if available (a datagram larger than ``burst`` needs a full bucket)."""
        self._refill(now)
        need = min(n, self.burst)
        if self._tokens >= need:
            self._tokens -= n
            return True
        return False

    def wait(self, n: int, now: float) -> float:
        """Seconds until ``take(n)`` can succeed."""
        self._refill(now)
        need = min(n, self.burst)
        return max(0.0, (need - self._tokens) / self.rate)


class Pacer:
    """Queue in front of a send function; :meth:`pump` returns when to pump again (or None)."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        bitrate: float,
        burst: int,
        now: float,
        max_queue: int = 65536,
        overhead: int = 0,
        send_many: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        self._send = send
        self._send_many = send_many
        """Sends a whole list at once (used when there is no bit rate to respect)."""
        self._overhead = overhead
        """Bytes ``send`` adds to each datagram (the network key's seal), charged too."""
        self._bucket = TokenBucket(bitrate / 8.0, burst, now) if bitrate > 0 else None
        self._queue: deque[bytes] = deque()
        self.max_queue = max_queue
        self.dropped = 0
        self.sent = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def ready_bytes(self, lookahead: float) -> int | None:
        """Bytes worth queueing now to keep the link busy ``lookahead`` seconds ahead (at
        least one full datagram's worth when idle); None when unpaced (anything goes)."""
        bucket = self._bucket
        if bucket is None:
            return None
        queued = sum(len(d) + self._overhead for d in self._queue)
        return max(0, int(bucket.rate * lookahead) + 1500 - queued)

    def push(self, data: bytes) -> None:
        if len(self._queue) >= self.max_queue:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(data)

    def push_many(self, datagrams: list[bytes]) -> None:
        if len(datagrams) <= self.max_queue - len(self._queue):
            self._queue.extend(datagrams)
            return
        for data in datagrams:
            self.push(data)

    def pump(self, now: float) -> float | None:
        """Send what the bucket allows; returns the delay before the next datagram may go."""
        bucket = self._bucket
        if bucket is None and self._send_many is not None and self._queue:
            batch = list(self._queue)
            self._queue.clear()
            self._send_many(batch)
            self.sent += len(batch)
            return None
        while self._queue:
            data = self._queue[0]
            size = len(data) + self._overhead
            if bucket is not None and not bucket.take(size, now):
                return bucket.wait(size, now)
            self._queue.popleft()
            self._send(data)
            self.sent += 1
        return None
