"""The core's node is assembled from parts, one module each (see ``dodwan/core/node_state.py``).

The parts talk to each other only through what :class:`NodeState` declares (mypy strict checks
every cross-part call against it), so no part imports another part's mixin, and none imports
the node that assembles them. This keeps each part readable on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dodwan.core.bits import all_of, first_bits, indexes

CORE = Path(__file__).resolve().parent.parent / "dodwan" / "core"
PARTS = ("cache", "delivery", "gossip", "catalogs", "transfers", "acks")


def _imports(module: str) -> dict[str, set[str]]:
    """Relative module -> the names a core module imports from it."""
    tree = ast.parse((CORE / f"{module}.py").read_text())
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.setdefault(node.module, set()).update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("part", PARTS)
def test_a_part_imports_no_other_part_and_not_the_node(part: str) -> None:
    imported = _imports(part)
    assert "node" not in imported
    assert "node_state" in imported, "a part builds on NodeState"
    for other in PARTS:
        if other == part:
            continue
        names = imported.get(other, set())
        # the cache's entry type is data every part handles; mixins stay apart
        assert not {n for n in names if n.endswith("Mixin")}, f"{part} imports {other}'s mixin"
        if other != "cache":
            assert not names, f"{part} imports {sorted(names)} from {other}"


def test_the_node_is_every_part_and_nothing_else() -> None:
    from dodwan.core import node, node_state

    bases = [b.__name__ for b in node.Node.__mro__[1:-1]]
    assert bases == [
        "TransfersMixin",
        "CatalogsMixin",
        "GossipMixin",
        "DeliveryMixin",
        "AcksMixin",
        "CacheMixin",
        "NodeState",
    ]
    assert node.Node.__mro__[-2] is node_state.NodeState


def test_fragment_masks() -> None:
    assert all_of(0) == 0 and all_of(3) == 0b111
    assert all_of(65536) is all_of(65536)  # one shared int per count
    assert indexes(0) == [] and indexes(0b101001) == [0, 3, 5]
    assert first_bits(0b101101, 2) == 0b000101
    assert first_bits(0b101101, 10) == 0b101101 and first_bits(0b1000, 0) == 0


@settings(max_examples=400, deadline=None)
@given(
    mask=st.one_of(
        st.integers(0, (1 << 3000) - 1), st.integers(0, 12).map(lambda k: (1 << (64 * k)) - 1)
    ),
    n=st.integers(-2, 3100),
)
def test_first_bits_is_the_n_lowest_set_bits(mask: int, n: int) -> None:
    """Word by word, the same as taking the lowest set bit ``n`` times (whole words of set
    bits, cuts at word ends, more bits asked than set)."""
    want = [i for i in range(mask.bit_length()) if mask >> i & 1][: max(n, 0)]
    assert first_bits(mask, n) == sum(1 << i for i in want)
