"""Per-producer order for one consumer: a bounded reorder window, sans-IO and clock-free.

Every topic message carries ``<producer>:<n>`` (its producer's n-th message to that topic,
from 1). A consumer passes what arrives through a :class:`Reorder`: a message whose
predecessors from the same producer were all delivered goes out at once; a later one is
held back until the gap is filled, or until ``gap_timeout`` seconds have passed since the
oldest held message of that producer arrived, or until the held bodies exceed
``window_bytes`` — then what is held goes out in order and a *gap* is counted. A message
arriving after its gap was given up on goes out at once and is counted *late*.

When a consumer first hears from a producer with n > 1 (it joined while the producer was
already sending, or the producer's first messages were lost or filtered out), it does not
know whether earlier ones will come: it holds them for ``gap_timeout`` like any gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


def parse_sequence(text: str) -> tuple[str, int] | None:
    """``producer:n`` -> (producer, n); None when absent or malformed."""
    producer, sep, num = text.rpartition(":")
    if not sep or not producer or not num.isdigit() or len(num) > 18:
        return None
    n = int(num)
    return (producer, n) if n >= 1 else None


@dataclass(slots=True)
class _Held(Generic[T]):
    item: T
    size: int
    since: float


@dataclass(slots=True)
class _Producer(Generic[T]):
    next: int | None = None
    """The number expected next (None: not known yet)."""
    held: dict[int, _Held[T]] = field(default_factory=dict)


class Reorder(Generic[T]):
    """Puts each producer's items back in order; returns what may be delivered now."""

    def __init__(self, gap_timeout: float, window_bytes: int, max_producers: int = 10_000) -> None:
        self.gap_timeout = gap_timeout
        self.window_bytes = window_bytes
        self.max_producers = max_producers
        self._producers: dict[str, _Producer[T]] = {}
        self.held_bytes = 0
        self.gaps = 0
        """Gaps given up on (a message was delivered although an earlier one was missing)."""
        self.late = 0
        """Messages that arrived after their gap had been given up on."""

    def push(self, producer: str, n: int, item: T, size: int, now: float) -> list[T]:
        p = self._producers.get(producer)
        if p is None:
            if len(self._producers) >= self.max_producers:
                self._forget_idle()
            p = self._producers[producer] = _Producer()
        if p.next is None and n == 1:
            p.next = 1
        if p.next is not None and n < p.next:
            self.late += 1
            return [item]
        if p.next is not None and n == p.next:
            p.next += 1
            return [item, *self._drain(p)]
        if n in p.held:  # the same message twice: keep the first
            return []
        p.held[n] = _Held(item, size, now)
        self.held_bytes += size
        out: list[T] = []
        while self.held_bytes > self.window_bytes:
            out.extend(self._give_up(self._oldest_producer()))
        return out

    def expire(self, now: float) -> list[T]:
        """Give up on the gaps older than the timeout; the items that go out, in order."""
        out: list[T] = []
        for p in list(self._producers.values()):
            while p.held and min(h.since for h in p.held.values()) + self.gap_timeout <= now:
                out.extend(self._give_up(p))
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do (None: nothing is held)."""
        times = [h.since for p in self._producers.values() for h in p.held.values()]
        return min(times) + self.gap_timeout if times else None

    def flush(self) -> list[T]:
        """Everything held, each producer's in order (the consumer goes away)."""
        out: list[T] = []
        for p in self._producers.values():
            while p.held:
                out.extend(self._give_up(p, count=False))
        return out

    @property
    def holding(self) -> int:
        return sum(len(p.held) for p in self._producers.values())

    # ------------------------------------------------------------------ internals
    def _drain(self, p: _Producer[T]) -> list[T]:
        out = []
        assert p.next is not None
        while p.next in p.held:
            h = p.held.pop(p.next)
            self.held_bytes -= h.size
            out.append(h.item)
            p.next += 1
        return out

    def _give_up(self, p: _Producer[T], *, count: bool = True) -> list[T]:
        """Skip to the lowest held number of ``p`` and deliver from there."""
        p.next = min(p.held)
        if count:
            self.gaps += 1
        return self._drain(p)

    def _oldest_producer(self) -> _Producer[T]:
        return min(
            (p for p in self._producers.values() if p.held),
            key=lambda p: min(h.since for h in p.held.values()),
        )

    def _forget_idle(self) -> None:
        for name in [k for k, p in self._producers.items() if not p.held]:
            del self._producers[name]
