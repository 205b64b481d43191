"""The radio medium: only hosts in range receive, after the air time, one datagram at a time."""

from __future__ import annotations

import random

import numpy as np
import pytest
import simpy

from sim import grid
from sim.medium import Medium


def make(n: int, bit_rate: float = 8000.0, loss: float = 0.0, seed: int = 1):
    env = simpy.Environment()
    got: list[tuple[float, int, int, bytes]] = []
    medium = Medium(
        env, n, bit_rate, loss, random.Random(seed), lambda r, s, d: got.append((env.now, r, s, d))
    )
    return env, medium, got


def test_broadcast_reaches_only_hosts_in_range() -> None:
    pos = np.array([[0.0, 0.0], [30.0, 0.0], [0.0, 49.0], [80.0, 0.0], [500.0, 500.0]])
    env, medium, got = make(5)
    n = len(pos)
    for code in grid.links(pos, 50.0).tolist():
        medium.link_up(code // n, code % n)
    medium.send(0, b"x" * 10, None)
    env.run()
    assert sorted(r for _, r, s, _ in got if s == 0) == [1, 2]


def test_unicast_reaches_only_the_addressee_if_in_range() -> None:
    env, medium, got = make(3)
    medium.link_up(0, 1)
    medium.link_up(0, 2)
    medium.send(0, b"hi", 2)
    medium.send(1, b"hi", 2)  # 1 and 2 are not neighbours
    env.run()
    assert [(r, s) for _, r, s, _ in got] == [(2, 0)]
    assert medium.unreachable == 1


def test_air_time_and_one_datagram_at_a_time() -> None:
    env, medium, got = make(2, bit_rate=8000.0)  # 1 byte = 1 ms
    medium.link_up(0, 1)
    medium.send(0, b"a" * 100, None)
    medium.send(0, b"b" * 50, None)
    medium.send(1, b"c" * 10, None)  # another sender's radio is independent
    env.run()
    times = {d[:1]: t for t, _, _, d in got}
    assert abs(times[b"a"] - 0.100) < 1e-12
    assert abs(times[b"b"] - 0.150) < 1e-12  # queued behind the first
    assert abs(times[b"c"] - 0.010) < 1e-12


def test_queue_drains_before_later_sends() -> None:
    env, medium, got = make(2, bit_rate=8000.0)
    medium.link_up(0, 1)
    medium.send(0, b"a" * 100, None)

    def later():
        yield env.timeout(1.0)
        medium.send(0, b"b" * 100, None)

    env.process(later())
    env.run()
    assert [round(t, 9) for t, *_ in got] == [0.1, 1.1]


def test_datagram_lost_when_receiver_leaves_during_air_time() -> None:
    env, medium, got = make(2, bit_rate=8000.0)
    medium.link_up(0, 1)
    medium.send(0, b"a" * 100, None)

    def leave():
        yield env.timeout(0.05)
        medium.link_down(0, 1)

    env.process(leave())
    env.run()
    assert got == []


def test_loss_is_per_receiver_with_the_configured_probability() -> None:
    env, medium, got = make(41, loss=0.3, seed=7)
    for j in range(1, 41):
        medium.link_up(0, j)
    for _ in range(250):
        medium.send(0, b"z", None)
    env.run()
    total = 250 * 40
    assert medium.delivered + medium.lost == total
    assert abs(medium.lost / total - 0.3) < 0.03
    assert len(got) == medium.delivered


def test_a_datagram_larger_than_the_mtu_is_lost_if_any_of_its_frames_is() -> None:
    """IP fragmentation: a 4,000-byte datagram is 3 frames of a 1,500-byte MTU (the
    default), each lost with probability ``loss``; it arrives only if all three do."""
    env, medium, got = make(41, bit_rate=1e9, loss=0.3, seed=7)
    for j in range(1, 41):
        medium.link_up(0, j)
    for _ in range(250):
        medium.send(0, b"z" * 4000, None)
    env.run()
    total = 250 * 40
    assert medium.delivered + medium.lost == total
    assert abs(medium.lost / total - (1 - 0.7**3)) < 0.03  # 0.657, not 0.3
    assert len(got) == medium.delivered
    assert [medium.frames(n) for n in (1, 1472, 1473, 2952, 2953, 4000)] == [1, 1, 2, 2, 3, 3]


def test_a_datagram_of_one_frame_draws_its_loss_as_before() -> None:
    """Up to one frame, one draw per receiver against ``loss`` itself (not a value
    recomputed from it): runs with datagrams within the MTU keep their results."""
    env, medium, got = make(3, bit_rate=1e9, loss=0.1, seed=11)
    medium.link_up(0, 1)
    medium.link_up(0, 2)
    for _ in range(200):
        medium.send(0, b"y" * 1400, None)
    env.run()
    rng = random.Random(11)
    expected = [(r, rng.random() >= 0.1) for _ in range(200) for r in (1, 2)]
    assert medium.delivered == sum(ok for _, ok in expected)
    assert [r for _, r, _, _ in got] == [r for r, ok in expected if ok]


def test_the_mtu_is_a_setting() -> None:
    env = simpy.Environment()
    medium = Medium(env, 2, 8000.0, 0.5, random.Random(1), lambda r, s, d: None, mtu=576)
    assert [medium.frames(n) for n in (544, 545, 1400)] == [1, 2, 3]  # 552 per fragment
    with pytest.raises(ValueError, match="mtu"):
        Medium(env, 2, 8000.0, 0.5, random.Random(1), lambda r, s, d: None, mtu=67)


def test_a_lone_broadcast_keeps_its_air_time_but_schedules_nothing() -> None:
    env, medium, got = make(2, bit_rate=8000.0)  # 1 byte = 1 ms
    idle: list[tuple[float, int]] = []
    medium.on_idle = lambda s: idle.append((env.now, s))
    medium.idle_needed = lambda s: False
    medium.links_fixed_until = 1.0
    end = medium.send(0, b"a" * 100, None)  # alone, links fixed until after its arrival
    assert abs(end - 0.100) < 1e-12
    assert medium.silent == 1 and not env._queue  # no arrival scheduled
    medium.link_up(0, 1)
    medium.send(0, b"b" * 50, None)  # the radio is still busy with the first
    env.run()
    assert [(round(t, 9), r, d[:1]) for t, r, _, d in got] == [(0.15, 1, b"b")]
    assert medium.sent == 2 and medium.silent == 1
    assert [s for _, s in idle] == [0]


def test_a_lone_broadcast_is_scheduled_when_anything_could_see_its_arrival() -> None:
    # a link may come up before it arrives
    env, medium, got = make(2, bit_rate=8000.0)
    medium.links_fixed_until = 0.05
    medium.send(0, b"a" * 100, None)
    # the idle call would have work to do
    medium.links_fixed_until = 1.0
    medium.idle_needed = lambda s: True
    medium.send(1, b"b" * 10, None)
    # an earlier datagram of the sender ("a") is still on the air
    medium.idle_needed = lambda s: False
    medium.send(0, b"c" * 10, None)
    assert medium.silent == 0 and medium.sent == 3
    medium.send(1, b"d" * 10, None)  # host 1's "b" is on the air too
    env.run()
    assert medium.silent == 0
    medium.send(1, b"e" * 10, None)  # now alone, idle, links fixed: not scheduled
    assert medium.silent == 1
    medium.send(0, b"f" * 10, 1)  # a unicast to a host out of range is counted on arrival
    assert medium.silent == 1
    env.run()
    assert got == [] and medium.delivered == 0  # no link ever came up
    assert medium.unreachable == 1
