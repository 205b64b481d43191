"""One memory budget for what peers make a host remember, shared fairly between them.

Everything a peer's datagrams make a node keep beyond the messages it caches — decoded
descriptors of offers, compiled profiles, profile pieces being assembled, the offers a
neighbour made — is *charged* here, in bytes, to the source address it came from (sender
names are free; one socket has one address). When the total passes the budget, the
address holding the most gives up its oldest item first, so a crowd of names behind one
socket, or a peer that floods, loses its own state before anyone else's, and a neighbour
that arrives later still gets its share: the others shrink towards an equal part.

The ledger only counts: giving an item up is the owner's ``evict(kind, key)`` callback,
which must drop the state (and may call :meth:`RemoteMemory.release`, a no-op by then).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable

Item = tuple[str, Hashable]
"""(kind, key): what a charge is for, e.g. ("descriptor", msg_id)."""


class RemoteMemory:
    """Bytes charged per source address against one ``budget``."""

    __slots__ = (
        "_evict",
        "_heap",
        "_items",
        "_owned",
        "_tie",
        "_totals",
        "budget",
        "evicted",
        "total",
    )

    def __init__(self, budget: int, evict: Callable[[str, Hashable], None]) -> None:
        self.budget = budget
        self.total = 0
        self.evicted = 0
        """Items given up to stay within the budget."""
        self._evict = evict
        self._items: dict[Item, tuple[Hashable, int]] = {}  # item -> (owner, bytes)
        self._owned: dict[Hashable, dict[Item, None]] = {}  # owner -> its items, oldest first
        self._totals: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []  # (-total, tie, owner), lazy
        self._tie = 0

    def charge(self, owner: Hashable, kind: str, key: Hashable, cost: int) -> None:
        """Charge ``cost`` bytes for ``(kind, key)`` to ``owner`` (replacing what it was
        charged before, and making it the owner's newest item); then give up the largest
        owners' oldest items until the total fits the budget again. The item just charged
        is never given up by its own charge."""
        item = (kind, key)
        self.release(kind, key)
        self._items[item] = (owner, cost)
        owned = self._owned.get(owner)
        if owned is None:
            owned = self._owned[owner] = {}
        owned[item] = None
        total = self._totals.get(owner, 0) + cost
        self._totals[owner] = total
        self.total += cost
        self._push(owner, total)
        if self.total > self.budget:
            self._shrink(item)

    def release(self, kind: str, key: Hashable) -> None:
        """The state for ``(kind, key)`` is gone: its bytes are free again."""
        item = (kind, key)
        entry = self._items.pop(item, None)
        if entry is None:
            return
        owner, cost = entry
        owned = self._owned[owner]
        del owned[item]
        self.total -= cost
        if owned:
            total = self._totals[owner] - cost
            self._totals[owner] = total
            # its heap entries now name a larger total and are skipped as stale: without a
            # fresh one, this owner would never be asked to give anything up again
            self._push(owner, total)
        else:
            del self._owned[owner]
            del self._totals[owner]

    def give_up(self, kind: str, key: Hashable) -> None:
        """The owner of ``(kind, key)`` drops it for a reason of its own (a bound on count):
        released, and passed to ``evict`` like a budget eviction, so whatever else refers
        to that state lets it go too (nothing happens when it is not charged)."""
        if (kind, key) in self._items:
            self.release(kind, key)
            self._evict(kind, key)

    def charged(self, kind: str, key: Hashable) -> int:
        """Bytes charged for ``(kind, key)`` (0 when nothing is)."""
        entry = self._items.get((kind, key))
        return 0 if entry is None else entry[1]

    def owner_of(self, kind: str, key: Hashable) -> Hashable | None:
        """Who ``(kind, key)`` is charged to (None when it is not charged)."""
        entry = self._items.get((kind, key))
        return None if entry is None else entry[0]

    def held_by(self, owner: Hashable) -> int:
        """Bytes charged to ``owner``."""
        return self._totals.get(owner, 0)

    def largest_share(self) -> int:
        """Bytes charged to the owner holding the most (0 when nothing is charged)."""
        owner = self._largest()
        return 0 if owner is None else self._totals[owner]

    def __len__(self) -> int:
        return len(self._items)

    def _push(self, owner: Hashable, total: int) -> None:
        self._tie += 1
        heapq.heappush(self._heap, (-total, self._tie, owner))
        if len(self._heap) > 2 * len(self._totals) + 64:  # drop stale entries
            self._heap = [(-t, i, o) for i, (o, t) in enumerate(self._totals.items())]
            heapq.heapify(self._heap)

    def _largest(self) -> Hashable | None:
        """The owner holding the most (stale heap entries skipped)."""
        heap = self._heap
        while heap:
            neg, _, owner = heap[0]
            if self._totals.get(owner) == -neg:
                return owner
            heapq.heappop(heap)
        return None

    def _shrink(self, keep: Item) -> None:
        spared: list[tuple[Hashable, int]] = []  # owners whose only item is ``keep``
        while self.total > self.budget:
            owner = self._largest()
            if owner is None:
                break
            victim = next((i for i in self._owned[owner] if i != keep), None)
            if victim is None:
                heapq.heappop(self._heap)
                spared.append((owner, self._totals[owner]))
                continue
            self.release(*victim)  # pushes the owner's new total
            self.evicted += 1
            self._evict(*victim)
        for owner, total in spared:
            if self._totals.get(owner) == total:
                self._push(owner, total)
