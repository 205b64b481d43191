"""The per-producer reorder window (joms.service.ordering), driven with explicit times."""

from __future__ import annotations

from joms.service.ordering import Reorder, parse_sequence


def test_in_order_messages_pass_at_once() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    assert [x for n in (1, 2, 3) for x in r.push("p", n, f"m{n}", 10, 0.0)] == ["m1", "m2", "m3"]
    assert r.gaps == 0 and r.holding == 0


def test_a_later_message_waits_for_the_gap_to_fill() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    assert r.push("p", 1, "m1", 10, 0.0) == ["m1"]
    assert r.push("p", 3, "m3", 10, 0.1) == []
    assert r.push("p", 4, "m4", 10, 0.2) == []
    assert r.next_deadline() == 2.1
    assert r.push("p", 2, "m2", 10, 0.3) == ["m2", "m3", "m4"]
    assert r.gaps == 0 and r.held_bytes == 0


def test_gap_timeout_delivers_what_is_held_and_counts_a_gap() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    r.push("p", 1, "m1", 10, 0.0)
    r.push("p", 3, "m3", 10, 1.0)
    assert r.expire(2.9) == []
    assert r.expire(3.0) == ["m3"]
    assert r.gaps == 1
    assert r.push("p", 2, "m2", 10, 3.5) == ["m2"]  # too late: delivered at once
    assert r.late == 1
    assert r.push("p", 4, "m4", 10, 3.6) == ["m4"]


def test_producers_are_independent() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    r.push("a", 1, "a1", 1, 0.0)
    assert r.push("a", 3, "a3", 1, 0.0) == []
    assert r.push("b", 1, "b1", 1, 0.0) == ["b1"]  # a's gap does not hold b back
    assert r.push("a", 2, "a2", 1, 0.0) == ["a2", "a3"]


def test_the_window_is_bounded_in_bytes() -> None:
    r: Reorder[str] = Reorder(60.0, 100)
    r.push("p", 1, "m1", 10, 0.0)
    assert r.push("p", 3, "m3", 60, 0.0) == []
    assert r.push("p", 4, "m4", 60, 0.1) == ["m3", "m4"]  # 120 bytes > 100: give up the gap
    assert r.gaps == 1 and r.held_bytes == 0


def test_first_message_from_an_unknown_producer_waits_for_earlier_ones() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    assert r.push("p", 5, "m5", 1, 0.0) == []  # joined mid-stream: 1..4 may still come
    assert r.push("p", 4, "m4", 1, 0.5) == []
    assert r.expire(2.0) == ["m4", "m5"]
    assert r.push("p", 6, "m6", 1, 2.1) == ["m6"]


def test_duplicates_are_held_once() -> None:
    r: Reorder[str] = Reorder(2.0, 1000)
    r.push("p", 1, "m1", 1, 0.0)
    assert r.push("p", 3, "m3", 1, 0.0) == []
    assert r.push("p", 3, "m3 again", 1, 0.0) == []
    assert r.push("p", 2, "m2", 1, 0.0) == ["m2", "m3"]


def test_parse_sequence() -> None:
    assert parse_sequence("h1/c1a:7") == ("h1/c1a", 7)
    assert parse_sequence("a:b:12") == ("a:b", 12)
    for bad in ("", "x", "p:", ":3", "p:0", "p:-1", "p:1.5", "p:" + "9" * 30):
        assert parse_sequence(bad) is None
