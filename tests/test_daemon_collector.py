"""The collector settings of the daemon and the JOMS runtime: start-up frozen, cyclic
garbage made afterwards still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dodwan.daemon.collector import YOUNG_THRESHOLD, settle_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_collector_freezes_the_start_up_and_still_collects_cycles(
    restored_collector: None,
) -> None:
    kept = [_Node() for _ in range(100)]  # built before serving: frozen
    settle_collector()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.isenabled()
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle made while serving, then dropped
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
