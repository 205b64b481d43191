"""bench/reference_routers.py: the reference routers' physics and decisions on hand-made
contacts with known answers (the whole-trace figures are in docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from reference_routers import ROUTERS, Msg, World  # noqa: E402

RATE = 250_000.0  # bytes per second: a 250 kB message takes 1 s
KB250 = 250_000


def world(router: str, n: int = 3, capacity: int = 1_000_000, physics: str = "one") -> World:
    return World(router, n, capacity, RATE, physics)


def contact(w: World, a: int, b: int, start: float, end: float) -> None:
    w.at(start, "up", (a, b))
    w.at(end, "down", (a, b))


def msg(
    mid: str, src: int, dst: int, t: float = 0.0, size: int = KB250, ttl: float = 3600.0
) -> Msg:
    return Msg(mid, src, dst, size, t, t + ttl)


@pytest.mark.parametrize("router", ROUTERS)
def test_a_contact_shorter_than_the_transfer_delivers_nothing_a_longer_one_delivers(
    router: str,
) -> None:
    w = world(router)
    w.at(0.0, "create", msg("M1", 0, 1))
    contact(w, 0, 1, 1.0, 1.5)  # 0.5 s: half the message
    contact(w, 0, 1, 10.0, 12.0)
    w.run(100.0)
    assert w.aborted == 1
    assert w.delivered == {"M1": 11.0}
    assert w.relayed == 1
    assert "M1" not in w.hosts[1].store  # a destination does not store what it gets


def test_a_carrier_relays_and_a_host_sends_one_message_at_a_time() -> None:
    w = world("epidemic")
    w.at(0.0, "create", msg("M1", 0, 2))
    w.at(0.0, "create", msg("M2", 0, 2))
    contact(w, 0, 1, 1.0, 4.0)  # both copied to 1, one after the other: at 2.0 and 3.0
    contact(w, 1, 2, 10.0, 11.5)  # room for one only
    w.run(100.0)
    assert w.delivered == {"M1": 11.0}
    assert w.relayed == 3 and w.aborted == 1
    assert [c.hops for c in w.hosts[1].store.values()] == [1, 1]


@pytest.mark.parametrize(
    ("physics", "delivered", "aborted"),
    [("one", {"A": 1.5}, 1), ("medium", {"A": 1.5, "B": 1.5}, 0)],
)
def test_the_one_receives_one_message_at_a_time_our_medium_from_every_sender(
    physics: str, delivered: dict[str, float], aborted: int
) -> None:
    w = world("epidemic", physics=physics)
    w.at(0.0, "create", msg("A", 0, 2))
    w.at(0.0, "create", msg("B", 1, 2))
    contact(w, 0, 2, 0.5, 2.0)
    contact(w, 1, 2, 0.5, 2.0)
    w.run(100.0)
    # under The ONE's physics host 2 takes one message at a time: the second sender
    # starts when the first is done and is cut off; our medium's radios send at once
    assert w.delivered == delivered
    assert w.aborted == aborted


def test_a_full_receiver_drops_its_oldest_copy_for_epidemic() -> None:
    w = world("epidemic", capacity=2 * KB250)
    for i, t in enumerate((0.0, 1.0, 2.0)):
        w.at(t, "create", msg(f"M{i}", 0, 2, t))
    w.at(0.5, "create", msg("X", 1, 2, 0.5))
    contact(w, 0, 1, 5.0, 7.5)
    w.run(100.0)
    # 0 could hold only two of its three (M0 dropped at M2's creation); 1 held X, received
    # M1 (dropping nothing), then M2 dropping X, its oldest
    assert list(w.hosts[0].store) == ["M1", "M2"]
    assert list(w.hosts[1].store) == ["M1", "M2"]


def test_binary_spray_and_wait_hands_on_half_its_copies_then_waits() -> None:
    w = world("spray", n=4)
    w.at(0.0, "create", msg("M1", 0, 3))
    contact(w, 0, 1, 1.0, 3.0)
    contact(w, 1, 2, 5.0, 7.0)
    w.run(100.0)
    assert w.hosts[0].store["M1"].copies == 3
    assert w.hosts[1].store["M1"].copies == 1  # gave 2 of its 3 to host 2
    assert w.hosts[2].store["M1"].copies == 2
    w2 = world("spray", n=5)
    w2.at(0.0, "create", msg("M1", 0, 3))
    contact(w2, 0, 1, 1.0, 3.0)
    contact(w2, 1, 2, 5.0, 7.0)
    contact(w2, 1, 4, 10.0, 12.0)  # host 1's last copy waits for the destination
    contact(w2, 1, 3, 20.0, 22.0)
    w2.run(100.0)
    assert "M1" not in w2.hosts[4].store
    assert w2.delivered == {"M1": 21.0}


def test_prophet_hands_a_message_only_to_a_host_likelier_to_meet_its_destination() -> None:
    w = world("prophet", n=4)
    w.at(0.0, "create", msg("M1", 0, 3, size=1_000))
    contact(w, 1, 3, 0.0, 1.0)  # host 1 met the destination, host 2 never did
    contact(w, 0, 2, 5.0, 7.0)
    contact(w, 0, 1, 10.0, 12.0)
    w.run(100.0)
    assert "M1" not in w.hosts[2].store
    assert w.hosts[1].store["M1"].hops == 1
    assert w.hosts[1].probs[3] > w.hosts[0].probs.get(3, 0.0)


def test_maxprop_acknowledgements_purge_the_copies_left_behind() -> None:
    w = world("maxprop", n=4)
    w.at(0.0, "create", msg("M1", 0, 2))
    contact(w, 0, 1, 1.0, 3.0)  # 1 gets a copy, 0 keeps its own
    contact(w, 1, 2, 5.0, 7.0)  # 1 delivers: it drops its copy for the acknowledgement
    contact(w, 1, 0, 10.0, 10.5)  # the acknowledgement reaches 0, which drops its copy
    contact(w, 0, 3, 20.0, 25.0)
    w.run(100.0)
    assert w.delivered == {"M1": 6.0}
    assert "M1" not in w.hosts[0].store and "M1" not in w.hosts[1].store
    assert "M1" not in w.hosts[3].store and "M1" in w.hosts[0].seen
    assert w.relayed == 2


def test_maxprop_never_sends_back_along_the_path_and_prefers_the_cheaper_destination() -> None:
    w = world("maxprop", n=5)
    contact(w, 1, 3, 0.0, 0.5)  # 1 met 3 once: 1's path to 3 is cheap
    w.at(1.0, "create", msg("far", 0, 4, 1.0))
    w.at(1.5, "create", msg("near", 0, 3, 1.5))
    contact(w, 0, 1, 2.0, 3.2)  # room for one message: the one host 1 reaches cheaply
    contact(w, 1, 0, 10.0, 13.0)
    w.run(100.0)
    assert list(w.hosts[1].store) == ["near", "far"]
    assert w.hosts[1].store["near"].received == pytest.approx(3.0)
    assert w.relayed == 2  # nothing went back from 1 to 0, which is on both paths


def test_the_script_prints_every_router_on_the_bundled_trace() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "reference_routers.py"), "--until", "600"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(ROUTERS)
    assert all(" delivered " in line and "ONE overhead" in line for line in lines)


def test_maxprop_costs_go_through_other_hosts_its_one_hop_variant_does_not() -> None:
    for router, cost_to_3 in (("maxprop", 1.0), ("maxprop1", None)):
        w = world(router, n=4)
        contact(w, 2, 3, 0.0, 0.5)  # 2 met 3
        contact(w, 1, 2, 1.0, 1.5)  # 1 met 2, and learnt 2's vector
        contact(w, 0, 1, 2.0, 2.5)  # 0 learnt both
        w.run(10.0)
        costs = w.maxprop_costs(w.hosts[0], 1)  # from 1, as 0 knows it
        # 1 -> 2 costs 1 - f_1(2) = 0.5 (1 met 0 and 2 once each); 2 -> 3 costs 1 - 0.5
        assert costs.get(3) == cost_to_3, router
        assert costs[2] == 0.5


def test_a_trace_is_read_as_the_simulator_reads_it_in_time_order_up_to_the_horizon(
    tmp_path: Path,
) -> None:
    from reference_routers import trace_contacts

    from sim.mobility.trace import TraceError

    hosts = ["h0", "h1", "h2"]
    good = tmp_path / "t.one.txt"
    good.write_text(
        "5 CONN 0 1 up  # a comment\n2 CONN h1 2 up\n\n9 CONN 0 1 down\n7 CONN 1 2 down\n"
    )
    got = trace_contacts(good, "one", hosts, 8.0)
    assert got == [(2.0, 1, 2, True), (5.0, 0, 1, True), (7.0, 1, 2, False)]
    bad = tmp_path / "bad.one.txt"
    bad.write_text("1 CONN 0 1 up\n2 CONN 0 0 up\n")
    with pytest.raises(
        TraceError, match=r"bad\.one\.txt:2: a host cannot be in contact with itself"
    ):
        trace_contacts(bad, "one", hosts, 10.0)


def test_a_scenario_without_a_trace_runs_on_the_contacts_its_mobility_makes() -> None:
    # the bundled trace holds the contacts of one_default.toml's own mobility (seed 1)
    from reference_routers import mobility_contacts, trace_contacts

    from sim.scenario import load

    moving = load(ROOT / "scenarios" / "one_default.toml")
    replay = load(ROOT / "scenarios" / "one_default_trace.toml")
    assert replay.contacts is not None and moving.contacts is None
    names = replay.host_names()
    want = trace_contacts(replay.contacts.path, "one", names, 900.0)
    got = mobility_contacts(moving, 900.0)
    assert len(want) > 50
    assert sorted(got) == sorted(want)


def test_each_host_has_its_own_group_s_buffer() -> None:
    # 1 relays a 250 kB message from 0 to 2 only if its own buffer can hold it
    delivered = []
    for caps in ([1_000_000, 200_000, 1_000_000], [1_000_000, 300_000, 1_000_000]):
        w = World("epidemic", 3, caps, RATE)
        w.at(0.0, "create", msg("M1", 0, 2))
        contact(w, 0, 1, 1.0, 3.0)
        contact(w, 1, 2, 10.0, 13.0)
        w.run(100.0)
        assert [h.capacity for h in w.hosts] == caps
        delivered.append(sorted(w.delivered))
    assert delivered == [[], ["M1"]]
    with pytest.raises(ValueError, match="2 capacities for 3 hosts"):
        World("epidemic", 3, [1, 2], RATE)
