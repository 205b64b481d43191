"""Spatial grid index: which pairs of hosts are within radio range, without all-pairs scans.

Hosts are bucketed into square cells of side = range; a pair can only be in range if its
cells are equal or adjacent, so each host is compared with the hosts of 5 cells (its own
and 4 of its 8 neighbours, so each pair is seen once). Everything is vectorised with
numpy. Links are encoded as ``i * n + j`` with ``i < j`` (host indices), sorted.
"""

from __future__ import annotations

import numpy as np

# Own cell plus the half of the neighbourhood that makes each adjacent pair appear once.
_OFFSETS = ((0, 0), (0, 1), (1, -1), (1, 0), (1, 1))


def links(pos: np.ndarray, radius: float) -> np.ndarray:
    """Sorted codes ``i * n + j`` (i < j) of every pair at distance <= radius."""
    n = pos.shape[0]
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    cell = np.floor(pos / radius).astype(np.int64)
    cx = cell[:, 0] - cell[:, 0].min() + 1
    cy = cell[:, 1] - cell[:, 1].min() + 1
    width = int(cy.max()) + 3
    key = cx * width + cy
    order = np.argsort(key, kind="stable")
    skey = key[order]
    r2 = radius * radius
    found = []
    for dx, dy in _OFFSETS:
        want = key + (dx * width + dy)
        lo = np.searchsorted(skey, want, "left")
        hi = np.searchsorted(skey, want, "right")
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            continue
        i = np.repeat(np.arange(n), counts)
        first = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        j = order[first + np.arange(total)]
        if dx == 0 and dy == 0:
            keep = i < j
            i, j = i[keep], j[keep]
        d = pos[i] - pos[j]
        close = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) <= r2
        i, j = i[close], j[close]
        found.append(np.minimum(i, j) * n + np.maximum(i, j))
    if not found:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(found))


def diff(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(links that came up, links that went down) between two sorted code arrays."""
    if old.size == new.size and np.array_equal(old, new):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    return (
        np.setdiff1d(new, old, assume_unique=True),
        np.setdiff1d(old, new, assume_unique=True),
    )
