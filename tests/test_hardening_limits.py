"""Every limit on what a peer can make a daemon hold or compute, provoked with real UDP
datagrams crafted with the wire encoders, is refused and counted in /status and /metrics."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zstandard
from hostile import Victim, announce, forge, news_victim, rss_mb
from test_daemon_helpers import DaemonProc, random_group, wait_for

from dodwan.core import Node, NodeConfig, wire
from dodwan.core import message as m

CAPACITY = 400_000
LIMITS_TOML = f"""
[node]
cache_capacity = {CAPACITY}
[node.limits]
max_requests_per_second = 20.0
max_partial_bytes = 50000
max_origin_share = 0.5
"""


def piece(patterns, index=0, count=1) -> bytes:  # type: ignore[no-untyped-def]
    return wire.encode_profile_piece("evil", "evil", 1, count, index, tuple(patterns))


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Victim]:
    tmp = tmp_path_factory.mktemp("limits")
    conf = tmp / "v.toml"
    conf.write_text(LIMITS_TOML)
    group = random_group()
    proc = DaemonProc(tmp / "v", ["--group", group, "--host-id", "v", "--config", str(conf),
                                  "--announce-period", "0.5"])  # fmt: skip
    proc.start()
    proc.client().post(
        "/subscribe",
        {"patterns": [{"topic": ".*"}], "sink": {"kind": "dir", "target": str(tmp / "out")}},
    )
    v = Victim(proc, group)
    yield v
    v.sock.close()
    proc.kill()
    text = proc.log.read_text()
    assert "Traceback" not in text


_PAT = (("topic", "x"),)
CASES: dict[str, tuple[Callable[[], list[bytes]], str]] = {
    "pieces per profile": (lambda: [announce(pieces=65)], "dropped_value_out_of_range"),
    "patterns per profile": (  # 5 pieces of 255 patterns: more than max_patterns (1024)
        lambda: (
            [announce(pieces=5)]
            + [piece([(("topic", f"{k}-{i}"),) for i in range(255)], k, 5) for k in range(5)]
        ),
        "dropped_bad_pattern",
    ),
    "pattern length": (lambda: [piece([(("topic", "x" * 300),)])], "dropped_regex_too_long"),
    "attributes per pattern": (
        lambda: [piece([tuple((f"a{i}", "x") for i in range(17))])],
        "dropped_bad_pattern_size",
    ),
    "relayed profiles": (
        lambda: [announce(relayed=[wire.ProfileRef(f"h{i}", 1, 1, 1) for i in range(65)])],
        "dropped_too_many_relayed_profiles",
    ),
    "catalog size": (
        lambda: [wire.encode_catalog("evil", 1, [b""] * 600)],
        "dropped_value_out_of_range",
    ),
    "request size": (
        lambda: [wire.encode_request("evil", "v", [("m", [(0, 1)])] * 300)],
        "dropped_value_out_of_range",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_announce_catalog_and_request_limits(victim: Victim, case: str) -> None:
    make, counter = CASES[case]
    victim.provoke(make(), counter)


def test_fragment_and_descriptor_limits(victim: Victim) -> None:
    msg_id, zdesc, desc, frags = forge("evil", b"hello", {"topic": "x"}, seed=1)
    # Fragments per message: an index beyond max_fragments.
    victim.provoke([wire.encode_fragment("evil", msg_id, 1, 70000, zdesc, b"x")],
                   "dropped_value_out_of_range")  # fmt: skip
    # Descriptor size: a zstd bomb as descriptor is refused by its declared size.
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 100_000)
    victim.provoke([wire.encode_fragment("evil", "evil-1", 1, 0, bomb, b"x")],
                   "dropped_bad_descriptor")  # fmt: skip
    # Attribute count.
    many = {**desc, **{f"a{i}": "v" for i in range(70)}}
    victim.provoke([wire.encode_fragment("evil", msg_id, 1, 0, m.compress_descriptor(many),
                                         frags[0])], "bad_descriptors")  # fmt: skip
    # Declared message size beyond max_message_size.
    huge = {**desc, "size": str(1 << 40)}
    victim.provoke([wire.encode_fragment("evil", msg_id, 1, 0, m.compress_descriptor(huge),
                                         frags[0])], "bad_descriptors")  # fmt: skip


def test_a_payload_bomb_is_refused_before_it_is_inflated(victim: Victim) -> None:
    msg_id, _, desc, _ = forge("evil", b"hello", {"topic": "bomb"}, seed=2)
    zbomb = zstandard.ZstdCompressor().compress(b"\0" * (16 << 20))  # 16 MB in ~500 bytes
    lying = {
        **desc,
        "zsize": str(len(zbomb)),
        "zhash": m.payload_digest(zbomb),
        "frags": "1",
        "fsize": str(len(zbomb)),
    }  # fmt: skip  (declares the 5 bytes of "hello")
    frag = wire.encode_fragment("evil", msg_id, 1, 0, m.compress_descriptor(lying), zbomb)
    victim.provoke([frag], "corrupt_messages")
    assert msg_id not in {e["id"] for e in victim.proc.client().get("/cache")}


def test_requests_per_neighbour_per_second(victim: Victim) -> None:
    payload = random.Random(1).randbytes(100_000)
    mid = victim.proc.client().publish_bytes(payload, attributes={"topic": "local"}, ttl=600)["id"]
    victim.provoke([announce(), wire.encode_request("evil", "v", [(mid, [(0, 70)])])],
                   "requests_rate_limited")  # fmt: skip


def test_reassembly_memory(victim: Victim) -> None:
    mid, zdesc, _, frags = forge("evil2", random.Random(2).randbytes(200_000), {"topic": "big"}, 3)
    entry = wire.encode_catalog_entry(wire.CatalogEntry(mid, len(frags), None, zdesc))
    victim.provoke([announce("evil2", entries=[entry])], "deferred_reassembly_budget")


def test_a_flooding_origin_gets_at_most_its_share_of_the_cache(victim: Victim) -> None:
    own = victim.proc.client().publish_bytes(b"mine", attributes={"topic": "own"}, ttl=600)["id"]
    datagrams = []
    for i in range(14):
        msg_id, zdesc, _, frags = forge("evil3", random.Random(10 + i).randbytes(20_000),
                                        {"topic": f"flood{i}"}, seed=100 + i)  # fmt: skip
        datagrams += [wire.encode_fragment("evil3", msg_id, 1, j, zdesc, f)
                      for j, f in enumerate(frags)]  # fmt: skip
    before = victim.counters()
    # Past its share, the origin's own older messages make room (or the newcomer is refused).
    victim.provoke(datagrams, "datagrams_received", at_least=len(datagrams))
    after = victim.counters()
    assert after.get("messages_evicted", 0) + after.get("origin_quota_exceeded", 0) > before.get(
        "messages_evicted", 0
    ) + before.get("origin_quota_exceeded", 0)
    cache = victim.proc.client().get("/cache")
    flooded = sum(e["stored_bytes"] for e in cache if e["descriptor"].get("origin") == "evil3")
    assert 0 < flooded <= CAPACITY * 0.5
    assert own in {e["id"] for e in cache}  # the host's own message was not evicted
    assert victim.proc.status()["cache"]["bytes"] <= CAPACITY
    assert victim.counters().get("internal_errors", 0) == 0


@pytest.mark.parametrize(
    ("deadline", "counter"), [("inf", "bad_descriptors"), ("1e300", "dropped_ttl_too_long")]
)
def test_a_message_living_for_ever_is_refused_and_listings_stay_valid(
    victim: Victim, deadline: str, counter: str
) -> None:
    # Such a descriptor used to be cached and delivered; afterwards `dodwan cache ls` and
    # `cache show` crashed with OverflowError and GET /cache emitted non-JSON Infinity.
    msg_id, _, desc, frags = forge("evil4", b"for ever", {"topic": "eternal"}, seed=7)
    forever = m.compress_descriptor({**desc, "deadline": deadline})
    victim.provoke(
        [announce("evil4"), wire.encode_fragment("evil4", msg_id, 1, 0, forever, frags[0])],
        counter,
    )
    client = victim.proc.client()
    assert msg_id not in {e["id"] for e in client.get("/cache")}  # valid JSON, not cached
    # a legitimate message still goes through, and a local publication for ever is refused
    ok = client.publish_bytes(b"fine", attributes={"topic": "fine"}, ttl=600)["id"]
    assert ok in {e["id"] for e in client.get("/cache")}
    from dodwan.daemon.client import ClientError

    with pytest.raises(ClientError, match="finite"):
        client.publish_bytes(b"x", attributes={"topic": "fine"}, ttl=float("inf"))
    with pytest.raises(ClientError, match="max_ttl"):
        client.publish_bytes(b"x", attributes={"topic": "fine"}, ttl=30 * 86400.0)


def test_a_request_repeating_one_range_does_not_stall_the_daemon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # One ~60 KB request naming the same range 15,000 times, for a 1 MB message held by a
    # daemon with default limits: each range was walked fragment by fragment (2-3 s of
    # event-loop stall per datagram) and fragments already queued cost no token.
    group = random_group()
    proc = DaemonProc(tmp_path / "d", ["--group", group, "--host-id", "v2"])
    proc.start()
    try:
        v = Victim(proc, group)
        client = proc.client()
        mid = client.publish_bytes(
            random.Random(5).randbytes(1_000_000), attributes={"topic": "big"}, ttl=600
        )["id"]
        request = wire.encode_request("evil5", "v2", [(mid, [(0, 65535)] * 15_000)])
        v.sock.sendto(announce("evil5"), v.dest)
        for _ in range(4):
            v.sock.sendto(request, v.dest)
        started = time.monotonic()
        proc.status()
        assert time.monotonic() - started < 1.0  # the admin API answers at once
        wait_for(lambda: v.counters().get("requests_rate_limited", 0) >= 1,
                 what="repeated requests charged to the rate limit")  # fmt: skip
        v.sock.close()
    finally:
        proc.kill()
    assert "Traceback" not in proc.log.read_text()


def test_a_profile_of_huge_expressions_costs_the_victim_nothing(
    victim: Victim, tmp_path: Path
) -> None:
    # 16 pieces of 64 patterns like `.{999}` x 7 (each under the 256-character limit): the
    # victim compiled them all, +460 MB RSS never released, admin API blocked for seconds.
    assert victim.proc.proc is not None
    pid = victim.proc.proc.pid
    before = rss_mb(pid)
    pieces = [
        wire.encode_profile_piece(
            "evil6", "evil6", 1, 16, k,
            tuple(((("topic", ".{999}" * 7 + f"{k}-{i}"),)) for i in range(64)),
        )
        for k in range(16)
    ]  # fmt: skip
    for _ in range(3):  # three versions, as a flood would
        victim.provoke([announce("evil6", pieces=16), *pieces], "dropped_bad_pattern")
        started = time.monotonic()
        victim.proc.status()
        assert time.monotonic() - started < 1.0
    assert rss_mb(pid) - before < 32
    # a legitimate publication still reaches the (subscribed) victim within 5 s
    pub = DaemonProc(tmp_path / "pub", ["--group", victim.group, "--host-id", "pub6",
                                        "--announce-period", "0.5"])  # fmt: skip
    pub.start()
    try:
        mid = pub.client().publish_bytes(b"legit", attributes={"topic": "after"}, ttl=600)["id"]
        wait_for(lambda: mid in {e["id"] for e in victim.proc.client().get("/cache")},
                 timeout=5.0, what="legitimate message at the victim")  # fmt: skip
    finally:
        pub.kill()


def test_a_flood_of_new_offers_from_one_socket_is_decoded_within_its_budget(
    tmp_path: Path,
) -> None:
    # 6,000 new descriptors the victim wants, offered by 30 sender names behind one socket
    # within a second: each was decoded, checked, matched and asked for, whatever the names.
    with news_victim(tmp_path, "7") as nv:
        evil = Node(NodeConfig(host_id="o7", max_datagram=1400), rng=random.Random(7))
        now = time.time()
        entries = []
        for i in range(6000):
            mid = evil.publish({"topic": f"news.{i}"}, b"x", deadline=now + 600, now=now)
            zdesc = evil._cache[mid].meta.zdesc
            entries.append(wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc)))
        for k in range(0, len(entries), 200):
            nv.v.sock.sendto(announce(f"evil7-{k}", entries=entries[k : k + 200]), nv.v.dest)
            time.sleep(0.005)  # paced: offers, not socket overflows, are what is measured
        nv.admin_answers_at_once()
        wait_for(lambda: nv.v.counters().get("descriptors_deferred", 0) >= 1000,
                 what="offers past the decode budget deferred")  # fmt: skip
        assert nv.rss_growth() < 32
        nv.legit_arrives_within_5_s(b"legit")


def test_all_zero_messages_of_one_origin_inflate_within_its_allowance(tmp_path: Path) -> None:
    # Legal all-zero messages of 8 MiB are ~1 KB of fragments each: the victim inflated every
    # one into its dir sink at once (64 MiB per message at the default maximum size).
    conf = tmp_path / "v.toml"
    conf.write_text(f"[node.limits]\nmax_inflation_per_origin = {20 << 20}\n")
    group = random_group()
    proc = DaemonProc(tmp_path / "d", ["--group", group, "--host-id", "v8", "--config", str(conf)])
    proc.start()
    out = tmp_path / "out"
    try:
        client = proc.client()
        client.post("/subscribe", {"patterns": [{"topic": "zeros"}],
                                   "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        v = Victim(proc, group)
        assert proc.proc is not None
        before = rss_mb(proc.proc.pid)
        bombs = [forge("evil8", bytes(8 << 20), {"topic": "zeros", "n": str(k)}, seed=k)
                 for k in range(3)]  # fmt: skip
        v.sock.sendto(announce("evil8"), v.dest)
        for msg_id, zdesc, _desc, frags in bombs:
            for i, chunk in enumerate(frags):
                v.sock.sendto(wire.encode_fragment("evil8", msg_id, 1, i, zdesc, chunk), v.dest)
        wait_for(lambda: v.counters().get("deliveries_deferred_inflation", 0) >= 1,
                 what="the third message waiting for its origin's allowance")  # fmt: skip
        started = time.monotonic()
        cached = {e["id"] for e in client.get("/cache")}
        assert time.monotonic() - started < 1.0
        assert {b[0] for b in bombs} <= cached  # all three kept, one not delivered yet

        def payloads() -> list[Path]:
            return [f for f in out.iterdir() if f.suffix != ".json"] if out.exists() else []

        wait_for(lambda: len(payloads()) == 2, what="two messages in the sink")
        assert sum(f.stat().st_size for f in payloads()) == 2 * (8 << 20)
        assert rss_mb(proc.proc.pid) - before < 32 + 16  # two 8 MiB payloads handled
        v.sock.close()
    finally:
        proc.kill()
    assert "Traceback" not in proc.log.read_text()


def test_junk_partial_sets_from_one_socket_leave_room_for_a_legitimate_message(
    tmp_path: Path,
) -> None:
    # Fragment 0 of many fake multi-fragment messages matching the victim's subscription,
    # from one socket under many names: their partial sets held the whole reassembly memory
    # for partial_timeout (30 min), and a legitimate multi-fragment message was put off
    # ("deferred_reassembly_budget") that long. One source address may now hold at most
    # max_partial_share of it (the default, 0.5; with 1.0 this test times out).
    config = f"[node.limits]\nmax_partial_bytes = {1 << 20}\nmax_partial_share = 0.5\n"
    with news_victim(tmp_path, "9", config) as nv:
        rng = random.Random(9)
        for k in range(120):  # 120 x ~14 kB declared: 1.6 MB of partial sets asked for
            name = f"junk9-{k}"
            msg_id, zdesc, _, frags = forge(name, rng.randbytes(14_000), {"topic": f"news.j{k}"},
                                            seed=k)  # fmt: skip
            nv.v.sock.sendto(announce(name), nv.v.dest)
            nv.v.sock.sendto(wire.encode_fragment(name, msg_id, 1, 0, zdesc, frags[0]), nv.v.dest)
            time.sleep(0.002)
        wait_for(lambda: nv.v.counters().get("partial_memory_full", 0) >= 1,
                 what="the junk's share of the reassembly memory full")  # fmt: skip
        nv.admin_answers_at_once()
        assert nv.rss_growth() < 32
        nv.legit_arrives_within_5_s(rng.randbytes(20_000))


def test_a_forged_offer_of_an_id_does_not_stop_the_genuine_message(tmp_path: Path) -> None:
    # One catalog entry naming an id under a valid descriptor the victim does not subscribe
    # to, living 7 days: the victim remembered "not wanted" for that id and never fetched
    # the genuine message published under it next, until the forged deadline.
    with news_victim(tmp_path, "w") as nv:
        mid = f"alert-{random.SystemRandom().randrange(1 << 40)}"
        forger = Node(NodeConfig(host_id="evilw"), rng=random.Random(5))
        now = time.time()
        forger.publish({"id": mid, "topic": "junk"}, b"junk", deadline=now + 7 * 86400 - 60,
                       now=now)  # fmt: skip
        zdesc = forger._cache[mid].meta.zdesc
        received = nv.v.counters().get("datagrams_received", 0)
        entry = wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc))
        nv.v.sock.sendto(announce("evilw", entries=[entry]), nv.v.dest)
        wait_for(lambda: nv.v.counters().get("datagrams_received", 0) > received,
                 what="the forged offer heard")  # fmt: skip
        nv.pub.start()
        payload = random.Random(3).randbytes(20_000)  # several fragments, most by digest
        nv.pub.client().publish_bytes(payload, attributes={"id": mid, "topic": "news.alert"},
                                      ttl=600)  # fmt: skip
        client = nv.proc.client()

        def genuine() -> bool:
            return any(e["id"] == mid and e["complete"] for e in client.get("/cache"))

        wait_for(genuine, timeout=10.0, what="the genuine message at the victim")
        [held] = [e for e in client.get("/cache") if e["id"] == mid]
        assert held["descriptor"]["topic"] == "news.alert"
        files = [p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()]
        assert payload in files
