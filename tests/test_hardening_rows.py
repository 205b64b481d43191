"""Every row of the hostile-neighbour issue's table, against a real daemon: offers of ids
declaring 65,536 fragments, descriptors padded to 8 KB, a crowd of sender names (with
offers, or with one-pattern profiles), a network-key holder's counter jumps, profiles of
huge expressions, a request repeating one range, fragment 0 of junk multi-fragment
messages, descriptors living for ever and all-zero messages (the last five are also
provoked, with other checks, in ``test_hardening_limits.py``).

Each test sends hand-crafted datagrams to a real victim daemon on a loopback group and
asserts what every row must: ``/status`` answers in under 1 s during the attack, a counter
shows the attack was received and handled (so a test cannot pass because nothing arrived),
the victim's own message is kept, a legitimate message published right after the attack is
complete at the victim within 5 s, and its RSS is within the row's budget + 32 MB of its
start: right after the attack, once the fake senders have expired as neighbours, and 30 s
after the attack (the victims stay up after their test and are all checked in one shared
wait at the end of the module).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zstandard
from hostile import NewsVictim, announce, forge, news_victim
from test_daemon_helpers import wait_for

from dodwan.core import wire
from dodwan.core.patterns import Profile
from dodwan.daemon import netkey as nk

SLACK_MB = 32.0
"""What the issue allows beyond a row's documented budget."""
SETTLE = 30.0
"""RSS is checked again this long after the attack."""
NEIGHBOUR_TIMEOUT = 15.0
"""The victims' (the default with the default announcement period, 5 s): a crowd of names
sent within it are all neighbours at once, as over a real radio."""
CONFIG = f"[node]\nneighbour_timeout = {NEIGHBOUR_TIMEOUT}\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_mb(pid: int) -> float:
    """The highest RSS the process ever had (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@dataclass
class Row:
    """One attacked victim, checked again 30 s after its attack."""

    name: str
    nv: NewsVictim
    budget_mb: float
    """The row's documented budget (beyond which RSS may grow by ``SLACK_MB`` more)."""
    ended: float | None = None
    """When the attack ended (monotonic); None while it has not."""


@dataclass
class Rows:
    """Victims kept running after their test until the module's shared 30 s check."""

    stack: ExitStack
    rows: list[Row] = field(default_factory=list)

    def victim(
        self,
        tmp_path: Path,
        name: str,
        budget_mb: float = 0.0,
        config: str = "",
        args: Sequence[str] = (),
    ) -> Row:
        """A victim whose config file is ``CONFIG`` + ``config``."""
        nv = self.stack.enter_context(news_victim(tmp_path, name, CONFIG + config, args))
        row = Row(name, nv, budget_mb)
        self.rows.append(row)
        return row


@pytest.fixture(scope="module")
def rows() -> Iterator[Rows]:
    with ExitStack() as stack:
        rows = Rows(stack)
        yield rows
        ended = [r.ended for r in rows.rows if r.ended is not None]
        if not ended:
            return
        # The wait is the interval the issue measures over, not a synchronisation: nothing
        # to await, only time to pass (one wait for every victim of the module).
        time.sleep(max(0.0, max(ended) + SETTLE - time.monotonic()))
        failures = []
        for r in rows.rows:
            if r.ended is None:
                continue
            growth = r.nv.rss_growth()
            if growth >= r.budget_mb + SLACK_MB:
                failures.append(f"{r.name}: RSS +{growth:.1f} MB {SETTLE:g} s after the attack "
                                f"(budget {r.budget_mb:g} + {SLACK_MB:g} MB)")  # fmt: skip
            cache = {e["id"] for e in r.nv.proc.client().get("/cache")}
            if r.nv.own not in cache:
                failures.append(f"{r.name}: its own message was lost")
        assert not failures, failures


class Flood:
    """Datagrams to the victim from ``sockets`` sockets (datagram i from socket i modulo
    ``sockets``), in batches of at most ``batch_bytes`` and ``batch_count``: each batch only once the victim's core has counted the previous
    one (flow control on its ``datagrams_received`` counter, not sleeps: a datagram lost
    to a full socket buffer would make an attack look cheap). ``/status`` is timed right
    after each batch is sent, while the victim works through it."""

    def __init__(self, nv: NewsVictim, sockets: int = 1) -> None:
        self.nv = nv
        self.socks = [nv.v.sock]
        for _ in range(sockets - 1):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            self.socks.append(s)
        self.start = nv.v.counters()
        self.sent = 0
        self.bytes = 0
        self.slowest = 0.0
        """The slowest ``/status`` answer during the attack, in seconds."""

    def delta(self, counter: str) -> int:
        return self.nv.v.counters().get(counter, 0) - self.start.get(counter, 0)

    def send(self, datagrams: Sequence[bytes], batch_bytes: int = 256_000, batch_count: int = 500,
             reach_core: bool = True, one_socket: bool = False) -> None:  # fmt: skip
        """Send them all (``one_socket``: all from the first socket); ``reach_core`` False
        for datagrams the victim drops before its core (the caller then waits on the
        counter that proves they were handled)."""
        socks = self.socks[:1] if one_socket else self.socks
        i = 0
        while i < len(datagrams):
            size = 0
            j = i
            while j < len(datagrams) and (
                j == i or (size + len(datagrams[j]) <= batch_bytes and j - i < batch_count)
            ):
                socks[j % len(socks)].sendto(datagrams[j], self.nv.v.dest)
                size += len(datagrams[j])
                j += 1
            self.bytes += size
            if reach_core:
                self.sent += j - i
            started = time.monotonic()
            self.nv.proc.status()
            self.slowest = max(self.slowest, time.monotonic() - started)
            assert self.slowest < 1.0, f"/status took {self.slowest:.2f} s during the attack"
            if reach_core:
                wait_for(lambda: self.delta("datagrams_received") >= self.sent, interval=0.01,
                         what=lambda: f"{self.sent} datagrams counted by the victim, "
                                      f"{self.delta('datagrams_received')} so far")  # fmt: skip
            i = j

    def close(self) -> None:
        for s in self.socks[1:]:
            s.close()


def after_attack(
    rows: Rows,
    row: Row,
    flood: Flood,
    legit: bytes = b"legit",
    refused: bool = False,
    expiry: bool = True,
) -> None:
    """What every row checks once its attack is over: no internal error, RSS within budget
    with the fake senders still neighbours, a legitimate message in time, its own message
    kept, and (``expiry``, for the rows about what neighbours hold) RSS within budget still
    once the fake senders have expired. ``refused``: the row's defence is to drop the
    attack's datagrams (the test checks the counter that says why); otherwise none may be
    dropped."""
    flood.close()
    row.ended = time.monotonic()
    assert row.nv.v.counters().get("internal_errors", 0) == 0
    if not refused:
        # every datagram of the attack was taken in, none refused whole by the wire limits
        # (which would make it cost nothing and the test prove nothing)
        assert flood.delta("datagrams_dropped") == 0
    row.nv.admin_answers_at_once()
    growth = row.nv.rss_growth()
    print(f"{row.name}: RSS +{growth:.1f} MB, {flood.bytes} bytes sent, "
          f"slowest /status {flood.slowest:.3f} s")  # fmt: skip
    assert growth < row.budget_mb + SLACK_MB, f"RSS +{growth:.1f} MB right after the attack"
    row.nv.legit_arrives_within_5_s(legit)
    if not expiry:  # the shared check 30 s after the attack comes later all the same
        return
    # the fake neighbours time out: what they left must not stay behind (it did, row 1)
    wait_for(lambda: not [n for n in row.nv.proc.status()["neighbours"] if n.startswith("x")],
             timeout=NEIGHBOUR_TIMEOUT + 10, what="the fake neighbours expired")  # fmt: skip
    growth = row.nv.rss_growth()
    assert growth < row.budget_mb + SLACK_MB, f"RSS +{growth:.1f} MB, fake neighbours gone"


def entry(desc: dict[str, str], frags: int, z: zstandard.ZstdCompressor) -> bytes:
    zdesc = z.compress(wire.encode_attributes(desc))
    return wire.encode_catalog_entry(wire.CatalogEntry(desc["id"], frags, None, zdesc))


# Fake sender names all start with "x" (the victim is "v...", the publisher "pub...").


def test_offers_of_ids_declaring_65536_fragments_cost_what_was_sent(
    rows: Rows, tmp_path: Path
) -> None:
    # Catalogs offering ids that declare 65,536 fragments each, from 300 sender names (half
    # behind one socket, half behind three), ~1.4 MB in all: the victim kept an 8 KiB
    # bitmask per offered id (+900 MB for 1.4 MB sent in the issue), still held after the
    # names expired. Its budget here: the offers of at most max_neighbours (256) names,
    # each a shared mask and a dict slot (~100 bytes), well under 32 MB.
    row = rows.victim(tmp_path, "1")
    _, _, small, _ = forge("x1o", b"x", {"topic": "nobody.huge"}, seed=1)
    huge = {**small, "size": "1", "zsize": str(65536 * 100), "frags": "65536",
            "fsize": "100", "zhash": "0" * 64}  # fmt: skip
    z = zstandard.ZstdCompressor(level=3)
    datagrams = []
    for k in range(300):
        entries = []
        for i in range(27):
            huge["id"] = f"x1-{k}-{i}"
            entries.append(entry(huge, 65536, z))
        datagrams.append(announce(f"x1s{k}", entries=entries))
    flood = Flood(row.nv, sockets=3)
    flood.send(datagrams[:150], one_socket=True)  # half the names behind one socket
    flood.send(datagrams[150:])  # the others behind three
    assert flood.bytes > 1_300_000
    assert flood.delta("neighbours_found") >= 300  # every name was heard
    # past max_neighbours (256), a name displaces another (or, on a slow machine, some
    # expired first): the victim let go of all but 256 names, and its cap did bite
    assert flood.delta("neighbours_lost") >= 300 - 256
    assert flood.delta("neighbours_displaced") >= 1
    after_attack(rows, row, flood)


def test_descriptors_padded_to_8_kb_are_kept_within_the_remote_memory_budget(
    rows: Rows, tmp_path: Path
) -> None:
    # Catalogs of valid descriptors padded to 8 KB (~190 bytes compressed): the victim kept
    # every one decoded (65,536 of them: 10.6 MB sent, +671 MB in the issue). With its
    # max_remote_memory lowered to 1 MiB, 6,000 of them from six sockets: the budget
    # must bite, whatever the victim decodes.
    budget = 1 << 20
    config = f"[node.limits]\nmax_remote_memory = {budget}\n"
    row = rows.victim(tmp_path, "2", budget / (1 << 20), config)
    _, _, desc, _ = forge("x2o", b"x", {"topic": "nobody.pad"}, seed=2)
    z = zstandard.ZstdCompressor(level=3)
    datagrams = []
    for k in range(30):
        entries = []
        for i in range(200):
            desc["id"] = f"x2-{k:05d}-{i:05d}"
            desc["pad"] = f"{k:05d}{i:05d}" * 780  # 8,004 bytes of attributes in all
            entries.append(entry(desc, 1, z))
        datagrams.append(announce(f"x2s{k}", entries=entries))
    flood = Flood(row.nv, sockets=6)
    flood.send(datagrams)
    # every offer was either decoded or put off by the decode budget: those decoded are
    # what the victim had to keep decoded, several times the remote-memory budget
    decoded = 30 * 200 - flood.delta("descriptors_deferred")
    assert decoded * 8000 > 4 * budget, decoded
    assert flood.delta("remote_memory_evicted_descriptor") > 0
    after_attack(rows, row, flood)


def send_in_parts(flood: Flood, datagrams: Sequence[bytes], parts: int = 4) -> list[float]:
    """Send ``datagrams`` in ``parts`` equal parts; the victim's CPU seconds for each."""
    pid = flood.nv.proc.proc.pid  # type: ignore[union-attr]
    size = -(-len(datagrams) // parts)
    spent = []
    for k in range(parts):
        cpu = cpu_seconds(pid)
        flood.send(datagrams[k * size : (k + 1) * size])
        spent.append(cpu_seconds(pid) - cpu)
    return spent


def check_linear(flood: Flood, spent: list[float], per_byte: float) -> None:
    """The victim's CPU for the attack is linear in what it received: the last part cost
    at most 2.5 times the first (a cost growing with the names already heard, the old
    behaviour, makes the last part several times dearer), and the whole at most
    ``per_byte`` seconds per byte received."""
    received = flood.delta("bytes_received")
    total = sum(spent)
    print(f"CPU per part {[round(x, 2) for x in spent]} s, {total / received * 1e6:.3f} us/byte")
    assert spent[-1] <= 2.5 * max(spent[0], 0.05), spent
    assert total <= per_byte * received, (total, received)


def test_a_crowd_of_sender_names_with_512_offers_each(rows: Rows, tmp_path: Path) -> None:
    # 3,000 distinct sender names with 512 offers each: +330 MB in the issue (every name a
    # neighbour holding its offers). 3,000 names behind two sockets. The offers' descriptors
    # are left empty: what a victim remembers of an offer is its id and mask whatever the
    # descriptor (valid ones are decoded once and cached: the padded-descriptor row), and
    # it keeps the attack at 25 MB sent instead of 150.
    row = rows.victim(tmp_path, "3")
    datagrams = []
    for k in range(3000):
        name = f"x3s{k}"
        entries = [wire.encode_catalog_entry(wire.CatalogEntry(f"x3-{k}-{i}", 1, None, b""))
                   for i in range(512)]  # fmt: skip
        datagrams.append(announce(name, entries=entries))
    flood = Flood(row.nv, sockets=2)
    spent = send_in_parts(flood, datagrams)
    assert flood.delta("neighbours_found") >= 3000
    # Measured on a 2-core machine shared with other test runs: 0.17-0.24 us of CPU per byte
    # received (1.3-1.8 ms per 7.4 KB catalog of 512 offers); the bound is over 10 times
    # that. The old code held +146 MB here.
    # past max_neighbours (256), a name displaces another (or, on a slow machine, some
    # expired first): the victim let go of all but 256 names, and its cap did bite
    # (checked last: the old code had no cap, and failed on memory first)
    let_go, displaced = flood.delta("neighbours_lost"), flood.delta("neighbours_displaced")
    check_linear(flood, spent, per_byte=3e-6)
    after_attack(rows, row, flood)
    assert let_go >= 3000 - 256 and displaced >= 1, (let_go, displaced)


def test_ten_thousand_one_pattern_announcements(rows: Rows, tmp_path: Path) -> None:
    # 10,000 sender names, each announcing a one-pattern profile (and sending its piece):
    # 15 s of CPU for 300 KB received in the issue, the cost growing faster than the input.
    row = rows.victim(tmp_path, "3b")
    datagrams = []
    for k in range(10_000):
        name = f"x3b{k}"
        specs = ((("topic", f"crowd\\.{k}"),),)
        version = Profile.from_patterns([dict(s) for s in specs]).version
        datagrams += [wire.encode_announce(name, 1, False, version, 1, [], []),
                      wire.encode_profile_piece(name, name, version, 1, 0, specs)]  # fmt: skip
    flood = Flood(row.nv)  # one socket: a name's announcement and piece from one address
    spent = send_in_parts(flood, datagrams)
    assert flood.delta("neighbours_found") >= 10_000
    assert flood.delta("profiles_assembled") >= 10_000
    # Measured on a 2-core machine shared with other test runs: 4.6-7.7 us of CPU per byte
    # received (150-250 us per 33-byte datagram: each is a new neighbour displacing another,
    # with a profile to compile and match); the bound is 10 times the quiet figure. The old
    # code spent 51 us per byte, its parts costing 2.0, 12.3, 9.0 and 10.6 s.
    check_linear(flood, spent, per_byte=46e-6)
    after_attack(rows, row, flood)


def test_a_key_holder_jumping_its_counter_costs_constant_memory_and_time(
    rows: Rows, tmp_path: Path
) -> None:
    # A network-key holder's sealed datagram whose counter jumps to 2**33 or 2**62: the
    # replay window shifted its bitmap that far (9.3 s of CPU and 2.2 GB, or a MemoryError
    # traceback). The victim and the legitimate publisher share the key.
    key = nk.generate_key()
    keyfile = tmp_path / "net.key"
    nk.write_secret_file(keyfile, nk.encode_key(key) + "\n")
    row = rows.victim(tmp_path, "4", args=["--network-key", str(keyfile)])
    pid = row.nv.proc.proc.pid  # type: ignore[union-attr]
    peak = peak_mb(pid)
    fresh, replays = [], []
    for a in range(3):  # three attackers (boot ids), each jumping three times
        jumper = nk.NetKey(key)
        fresh.append(jumper.seal(announce(f"x4j{a}")))  # counter 1
        for counter in (2**33, 2**62, 2**64 - 1):
            jumper._counter = counter - 1
            fresh.append(jumper.seal(announce(f"x4j{a}")))
        replays.append(fresh[-3])  # the 2**33 one again: now far behind the window
    cpu = cpu_seconds(pid)
    flood = Flood(row.nv)
    flood.send(fresh, batch_count=4)
    flood.send(replays, reach_core=False)
    wait_for(lambda: flood.delta("netkey_replayed") >= len(replays), what="replays refused")
    cpu = cpu_seconds(pid) - cpu
    print(f"4: {cpu:.2f} s CPU, peak +{peak_mb(pid) - peak:.1f} MB")
    assert flood.delta("neighbours_found") >= 3
    assert flood.delta("netkey_rejected") == 0  # they were authentic
    # constant time and memory: not even a transient peak (the old code's 2**33 shift made
    # a 1 GiB integer for a moment), and a fraction of a second of CPU for 15 datagrams
    assert peak_mb(pid) - peak < SLACK_MB
    assert cpu < 1.0
    after_attack(rows, row, flood)


# The rows test_hardening_limits.py provokes too, here with every check of the issue (RSS
# 30 s after, a legitimate message in 5 s, nothing stored lost, /status < 1 s throughout).


def test_profiles_of_huge_expressions(rows: Rows, tmp_path: Path) -> None:
    # One 54 KB announcement's worth of profile: 16 pieces x 64 expressions like `.{999}`
    # repeated 7 times, each under the per-expression length limit: +460 MB, admin API
    # blocked 12.7 s in the issue; eight such profiles 3.7 GB. Refused: each expression
    # compiles past max_regex_program.
    row = rows.victim(tmp_path, "0")
    datagrams = []
    for v in range(1, 9):  # eight profiles
        name = f"x0s{v}"
        datagrams.append(wire.encode_announce(name, 1, False, v, 16, [], []))
        for k in range(16):
            specs = tuple(((("topic", ".{999}" * 7 + f"{v}-{k}-{i}"),)) for i in range(64))
            datagrams.append(wire.encode_profile_piece(name, name, v, 16, k, specs))
    flood = Flood(row.nv)
    flood.send(datagrams)
    assert flood.delta("dropped_bad_pattern") >= 8  # every profile refused, none compiled
    after_attack(rows, row, flood, refused=True, expiry=False)


def test_a_request_repeating_one_range(rows: Rows, tmp_path: Path) -> None:
    # A 60 KB request naming the same range of the victim's 1 MB message 15,000 times: the
    # event loop stalled 2.3-3.5 s per datagram and the rate limiter counted nothing.
    row = rows.victim(tmp_path, "5")
    client = row.nv.proc.client()
    mid = client.publish_bytes(
        os.urandom(1_000_000), attributes={"topic": "big"}, ttl=600
    )["id"]  # fmt: skip
    datagrams = [announce("x5s")]
    for first in range(8):  # each request a different datagram
        datagrams.append(wire.encode_request("x5s", "v5", [(mid, [(first, 65535)] * 15_000)]))
    flood = Flood(row.nv)
    flood.send(datagrams, batch_count=2)
    wait_for(lambda: flood.delta("requests_rate_limited") >= 1,
             what="the repeated ranges charged to the serving budget")  # fmt: skip
    assert mid in {e["id"] for e in client.get("/cache")}
    after_attack(rows, row, flood, expiry=False)


def test_fragment_zeros_of_junk_multi_fragment_messages(rows: Rows, tmp_path: Path) -> None:
    # Fragment 0 of many fake multi-fragment messages matching the victim's subscription,
    # from one socket under many names: the partial sets held the reassembly memory, and a
    # real message waited 50 s (or for ever under a steady flood). Budget: the reassembly
    # memory, lowered here to 1 MiB so that the junk fills it.
    config = f"[node.limits]\nmax_partial_bytes = {1 << 20}\n"
    row = rows.victim(tmp_path, "6", 1.0, config)
    datagrams = []
    for k in range(120):  # 120 x ~14 kB declared: 1.6 MB of partial sets
        name = f"x6s{k}"
        msg_id, zdesc, _, frags = forge(name, bytes([k]) * 7 + os.urandom(14_000),
                                        {"topic": f"news.j{k}"}, seed=k)  # fmt: skip
        datagrams += [announce(name), wire.encode_fragment(name, msg_id, 1, 0, zdesc, frags[0])]
    flood = Flood(row.nv)
    flood.send(datagrams)
    wait_for(lambda: flood.delta("partial_memory_full") >= 1,
             what="the junk's share of the reassembly memory full")  # fmt: skip
    after_attack(rows, row, flood, legit=os.urandom(20_000), expiry=False)  # multi-fragment


def test_descriptors_living_for_ever(rows: Rows, tmp_path: Path) -> None:
    # A deadline of inf or 1e300: accepted, cached and delivered; afterwards `dodwan cache
    # ls` crashed and GET /cache emitted non-JSON Infinity. Refused: non-finite times and
    # lifetimes past max_ttl.
    row = rows.victim(tmp_path, "7")
    msg_id, _, desc, frags = forge("x7o", b"for ever", {"topic": "news.eternal"}, seed=7)
    datagrams = [announce("x7s")]
    for i, deadline in enumerate(("inf", "1e300") * 10):
        d = {**desc, "id": f"{msg_id}{i}", "deadline": deadline}
        zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(d))
        datagrams.append(wire.encode_fragment("x7s", d["id"], 1, 0, zdesc, frags[0]))
    flood = Flood(row.nv)
    flood.send(datagrams)
    assert flood.delta("bad_descriptors") >= 10  # inf: not a time
    assert flood.delta("dropped_ttl_too_long") >= 10  # 1e300: past max_ttl
    listing = row.nv.proc.client().get("/cache")  # valid JSON, none of them cached
    assert not [e for e in listing if e["id"].startswith(msg_id)]
    after_attack(rows, row, flood, refused=True, expiry=False)


def test_all_zero_messages_inflate_within_their_origins_allowance(
    rows: Rows, tmp_path: Path
) -> None:
    # Five legal 64 MiB all-zero messages (12 KB of fragments) wrote 321 MB into a --dir
    # sink. Here three of 8 MiB with the origin's allowance at 20 MiB: two are delivered, the
    # third waits (cached) for the allowance to refill. Budget: the two payloads inflated.
    config = f"[node.limits]\nmax_inflation_per_origin = {20 << 20}\n"
    row = rows.victim(tmp_path, "8", 16.0, config)
    datagrams = [announce("x8s")]
    bombs = []
    for k in range(3):
        msg_id, zdesc, _, frags = forge("x8o", bytes(8 << 20), {"topic": f"news.zero{k}"}, k)
        bombs.append(msg_id)
        datagrams += [wire.encode_fragment("x8s", msg_id, 1, i, zdesc, f)
                      for i, f in enumerate(frags)]  # fmt: skip
    flood = Flood(row.nv)
    flood.send(datagrams)
    wait_for(lambda: flood.delta("deliveries_deferred_inflation") >= 1,
             what="the third message waiting for its origin's allowance")  # fmt: skip
    out = tmp_path / "out"
    wait_for(lambda: len([f for f in out.iterdir() if f.stat().st_size == 8 << 20]) == 2,
             what="two payloads in the sink")  # fmt: skip
    cached = {e["id"] for e in row.nv.proc.client().get("/cache")}
    assert set(bombs) <= cached  # all three kept, one not delivered yet
    after_attack(rows, row, flood, expiry=False)
