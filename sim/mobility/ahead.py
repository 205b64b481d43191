"""Link changes read ahead of the clock: until when no link of a host can come up.

A host that is alone, with nothing of its own in the air, can be let run its presence timers
(beacons and announcements nobody hears) without waking it through the event queue, up to
the next time a link of its may come up (``SimHost`` does so). This module answers that
question for both sources of links: the scenario's own mobility, read a bounded window
ahead of the clock, and a replayed contact trace, whose link-ups are all known up front.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

Step = tuple[float, np.ndarray, np.ndarray]
"""``(time, up, down)``: link codes ``i * n + j`` that came up and went down at ``time``."""

WINDOW = 60.0
"""Seconds of mobility read ahead of the clock, at most (what a host's quiet span can reach:
the read-ahead steps are kept until the clock reaches them)."""


class LinksAhead:
    """Per host, the coming times at which one of its links comes up."""

    def __init__(self, n: int, window: float = WINDOW) -> None:
        self._n = n
        self._window = window
        self._ups: list[deque[float]] = [deque() for _ in range(n)]
        self._source: Iterator[Step] | None = None
        self._buffer: deque[Step] = deque()
        self.known_until = math.inf
        """Every link-up at or before this time is known (all of them when infinite)."""

    @classmethod
    def of_steps(cls, steps: Iterable[Step], n: int, window: float = WINDOW) -> LinksAhead:
        """Link changes made as the run goes (mobility): read ahead on demand; replay them
        through :meth:`steps`."""
        ahead = cls(n, window)
        ahead._source = iter(steps)
        ahead.known_until = -math.inf
        return ahead

    @classmethod
    def of_events(cls, events: Iterable[tuple[float, int, int, bool]], n: int) -> LinksAhead:
        """A replayed trace's ``(time, i, j, up)`` events in time order: all known now."""
        ahead = cls(n)
        for t, i, j, up in events:
            if up:
                ahead._ups[i].append(t)
                ahead._ups[j].append(t)
        return ahead

    def steps(self) -> Iterator[Step]:
        """The link changes in order, those already read ahead first (mobility only)."""
        while self._buffer or self._read():
            yield self._buffer.popleft()

    def _read(self) -> bool:
        """Read one more step of the source; False when there is none."""
        step = next(self._source, None) if self._source is not None else None
        if step is None:
            self.known_until = math.inf
            return False
        t, up, _down = step
        n, ups = self._n, self._ups
        for code in up.tolist():
            ups[code // n].append(t)
            ups[code % n].append(t)
        self._buffer.append(step)
        self.known_until = t
        return True

    def quiet_until(self, host: int, now: float) -> float:
        """A time before which no link of ``host`` comes up (``now`` when one may come up
        at ``now`` itself): its next link-up, or as far as the links are known, read ahead
        up to ``window`` past ``now``."""
        ups = self._ups[host]
        while ups and ups[0] < now:  # came up already (the clock is past it)
            ups.popleft()
        while not ups and self.known_until < now + self._window and self._read():
            pass
        return ups[0] if ups else self.known_until
