"""Daemon building blocks without processes: SQLite store, config, pacer, media, sinks."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from dodwan.core import MessageDelivered, Node, NodeConfig
from dodwan.core.store import MessageMeta
from dodwan.daemon import config as cfg
from dodwan.daemon.pacer import Pacer, TokenBucket
from dodwan.daemon.sinks import exec_environment, file_name, write_to_dir
from dodwan.daemon.sqlite_store import MIGRATIONS, SCHEMA_VERSION, SqliteStore, StoreError
from dodwan.daemon.transport import medium_for, parse_address

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------- SQLite store


def test_store_round_trip_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    s = SqliteStore(path)
    s.put_message(MessageMeta("m1", b"\x01zdesc", 2, False, 12.5))
    s.put_fragment("m1", 0, b"aaa")
    s.put_fragment("m1", 3, b"ddd")
    s.add_history("m1", "k", 99.0)
    s.add_history("m0", "", 5.0)
    s.put_subscription("k", [{"topic": "x.*"}])
    s.put_sink("k", "dir", "/tmp/out")
    s.set_meta("host_id", "h1")
    s.commit()
    s.put_fragment("m1", 4, b"uncommitted")  # never committed: must vanish
    s.conn.close()

    s2 = SqliteStore(path)
    [(meta, idx)] = list(s2.iter_messages())
    assert meta == MessageMeta("m1", b"\x01zdesc", 2, False, 12.5)
    assert idx == [0, 3]
    assert s2.get_fragment("m1", 3) == b"ddd" and s2.get_fragment("m1", 4) is None
    assert sorted(s2.iter_history()) == [("m0", "", 5.0), ("m1", "k", 99.0)]
    s2.purge_history(10.0)
    assert list(s2.iter_history()) == [("m1", "k", 99.0)]
    assert list(s2.iter_subscriptions()) == [("k", [{"topic": "x.*"}])]
    assert [(r.key, r.kind, r.target) for r in s2.iter_sinks()] == [("k", "dir", "/tmp/out")]
    assert s2.get_meta("host_id") == "h1" and s2.get_meta("nope") is None
    s2.delete_message("m1")
    s2.delete_subscription("k")
    s2.commit()
    assert list(s2.iter_messages()) == [] and list(s2.iter_subscriptions()) == []
    assert s2.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s2.close()


def test_store_rows_written_later_keep_their_order_and_are_read_back(tmp_path: Path) -> None:
    """Message and history rows wait for the next statement, read or commit (one
    executemany): a deletion after them, a read, a rollback see them as if written at once."""
    path = tmp_path / "later.db"
    s = SqliteStore(path, commit_delay=3600.0)
    s.put_message(MessageMeta("gone", b"z", 0, True, 1.0))
    s.add_history("gone", "k", 50.0)
    s.delete_message("gone")  # the row inserted just before is deleted, not left behind
    s.put_message(MessageMeta("kept", b"z1", 1, False, 2.0))
    s.put_message(MessageMeta("kept", b"z2", 2, False, 3.0))  # the later one wins
    s.add_history("kept", "k", 60.0)
    s.put_sink("k", "dir", str(tmp_path / "out"))
    assert sorted(s.iter_history()) == [("gone", "k", 50.0), ("kept", "k", 60.0)]
    assert ("kept", "k", 60.0) in s.unfinished_deliveries()
    assert [m for m, _ in s.iter_messages()] == [MessageMeta("kept", b"z2", 2, False, 3.0)]
    s.add_history("late", "k", 70.0)
    s.purge_history(55.0)  # a statement after a waiting row: the row goes in first
    assert sorted(s.iter_history()) == [("kept", "k", 60.0), ("late", "k", 70.0)]
    s.put_message(MessageMeta("rolled", b"z", 0, True, 1.0))
    s._fail(sqlite3.OperationalError("disk I/O error"))  # as a failed write would
    s.commit()  # rolled back: the waiting row with it
    assert s.take_failed() == {"gone", "kept", "rolled"}
    s.put_message(MessageMeta("after", b"z", 0, True, 1.0))
    s.add_history("after", "k", 80.0)
    s.commit()
    other = sqlite3.connect(path)
    assert other.execute("SELECT msg_id FROM messages").fetchall() == [("after",)]
    assert other.execute("SELECT msg_id, key FROM history").fetchall() == [("after", "k")]
    other.close()
    s.close()


def test_store_records_migrations_and_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    s = SqliteStore(path)
    assert s.schema_version() == SCHEMA_VERSION == MIGRATIONS[-1][0]
    versions = [r["version"] for r in s.db["migrations"].rows]
    assert versions == [v for v, _, _ in MIGRATIONS]
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO migrations(version, name, applied) VALUES (999, 'future', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        SqliteStore(path)


def test_store_upgrades_a_version_1_database(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    import sqlite_utils

    db = sqlite_utils.Database(path)
    db["migrations"].create({"version": int, "name": str, "applied": float}, pk="version")
    MIGRATIONS[0][2](db)
    db["migrations"].insert({"version": 1, "name": "v1", "applied": 0.0})
    db["subscriptions"].insert({"key": "k", "specs": json.dumps([{"a": "b"}])})
    db.conn.close()
    s = SqliteStore(path)
    assert s.schema_version() == SCHEMA_VERSION
    assert list(s.iter_subscriptions()) == [("k", [{"a": "b"}])]
    assert list(s.iter_sinks()) == []


def test_store_rejects_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a DoDWAN database"):
        SqliteStore(path)


def test_node_restarts_on_the_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    payload = random.Random(1).randbytes(20000)
    n = Node(NodeConfig(host_id="h"), rng=random.Random(1), store=SqliteStore(path))
    key = n.subscribe({"topic": "a"}, now=1.0)
    mid = n.publish({"topic": "a"}, payload, deadline=1000.0, now=1.0)
    assert n.next_event() is not None  # delivered once to the local subscription
    # A new process on the same file: cache, subscription and history are back.
    n2 = Node(NodeConfig(host_id="h"), rng=random.Random(2), store=SqliteStore(path))
    assert n2.subscriptions() == {key: [{"topic": "a"}]}
    assert n2.message_payload(mid) == payload
    n2.subscribe({"topic": "a"}, now=2.0, key=key)
    assert n2.next_event() is None  # not delivered twice


# ---------------------------------------------------------------------- config


def test_defaults_are_ipv4_multicast_on_loopback_and_a_local_admin_api() -> None:
    c = cfg.load(None)
    assert (c.group, c.interface, c.admin) == ("239.255.42.42:8500", "lo", "127.0.0.1:0")
    assert medium_for(c.group, c.interface).kind == "multicast4"
    assert c.network_key == "" and c.bitrate == 0  # no key, no pacing unless configured


def test_config_file_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('interface = "eth9"\nbitrate = 2000000\n[node]\nannounce_period = 2.5\n')
    c = cfg.load(f, {"bitrate": 1000, "altruistic": True, "group": None})
    assert c.interface == "eth9" and c.bitrate == 1000 and c.group == cfg.DEFAULT_GROUP
    nc = c.node_config("h")
    assert nc.announce_period == 2.5 and nc.altruistic is True
    assert c.joms == {}


def test_a_config_file_may_start_with_a_utf8_bom(tmp_path: Path) -> None:
    """Windows editors write one; it gave 'Invalid statement (at line 1, column 1)'.
    Contact traces and external-events files already skip it."""
    f = tmp_path / "c.toml"
    text = 'interface = "eth9"\nbitrate = 2000000\n[node]\nannounce_period = 2.5\n'
    f.write_bytes(b"\xef\xbb\xbf" + text.encode())
    c = cfg.load(f)
    assert (c.interface, c.bitrate, c.node["announce_period"]) == ("eth9", 2000000, 2.5)
    f.write_bytes(b"\xef\xbb\xbf\xef\xbb\xbf" + text.encode())  # one BOM, not two
    with pytest.raises(cfg.ConfigError, match="not valid TOML"):
        cfg.load(f)


def test_config_file_joms_table(tmp_path: Path) -> None:
    """The ``[joms]`` table reaches the STOMP gateway's service as written (the service
    builds its ServiceConfig from it)."""
    f = tmp_path / "c.toml"
    f.write_text("[joms]\nmax_redeliveries = 2\norder_gap_timeout = 1\n")
    c = cfg.load(f)
    assert c.joms == {"max_redeliveries": 2, "order_gap_timeout": 1}
    from joms.service.config import ServiceConfig

    sc = ServiceConfig.from_mapping(c.joms)
    assert sc.max_redeliveries == 2 and sc.order_gap_timeout == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nonsense = 1\n", "unknown setting"),
        ("bitrate = 'fast'\n", "must be an integer"),
        ("[node]\nhorizon = 'x'\n", "must be an integer"),
        ("[node]\nbogus = 1\n", "unknown setting node.bogus"),
        ("[node.limits]\nmax_descriptor_cache = 1\n", "replaced by node.limits.max_remote_memory"),
        ("[node.limits]\nmax_remote_memory = 1000\n", "max_remote_memory"),
        ("this is not toml", "not valid TOML"),
        ("log_level = 'loud'\n", "log_level"),
        ("joms = 1\n", r"\[joms\] must be a table"),
        ("[joms]\nmax_redelivery = 3\n", r"\[joms\]: unknown JOMS setting\(s\) max_redelivery"),
        ("[joms]\norder_gap_timeout = 'soon'\n", "order_gap_timeout must be a float"),
        ("[joms]\nmax_redeliveries = -2\n", "max_redeliveries must be >= 0"),
        ("[node.limits]\nmax_message_size = 10000\n", "max_message_size .*at least 16385"),
        ("[node]\ncache_capacity = 1000\n", "cache_capacity = 1000 is out of range"),
        # checked at start with or without --stomp, one line naming the setting
        # one setting named, the one that is wrong (not "X and Y must ...")
        ("exec_concurrency = 0\n", r"^exec_concurrency must be at least 1"),
        ("burst = 0\n", r"^burst must be at least 1"),
        ("[joms]\nack_delay = -1\n", r"\.toml: \[joms\]: ack_delay must be >= 0$"),
        ("[joms]\nlease = 0\n", r"\.toml: \[joms\]: lease must be positive$"),
        ("[joms]\ndirectory_period = 0\n", r"\.toml: \[joms\]: directory_period must be positive$"),
        (
            "[joms]\norder_window_bytes = -1\n",
            r"\.toml: \[joms\]: order_window_bytes must be >= 0$",
        ),
        ("[joms]\nreceiver_policy = 'nosuchmod_x:f'\n", r"\[joms\]: receiver_policy .*import"),
        ("[joms]\nreceiver_policy = 'os:nonexistent'\n", r"\[joms\]: receiver_policy .*attr"),
        ("[joms]\nreceiver_policy = 'json:loads'\n", r"\[joms\]: receiver_policy .*TypeError"),
        ("[joms]\nlease = nan\n", r"\[joms\]: lease must be a finite number"),
        ("[joms]\ndefault_ttl = inf\n", r"\[joms\]: default_ttl must be a finite number"),
        ("[joms]\ndirectory_period = nan\n", r"\[joms\]: directory_period must be a finite"),
        # upper bounds (none once: a day-long ack batch, a lease of years were accepted)
        ("[joms]\nack_delay = 3600\n", r"\[joms\]: ack_delay must be at most 10 "),
        ("[joms]\nlease = 1e9\n", r"\[joms\]: lease must be at most 86400 s "),
        ("[joms]\norder_gap_timeout = 1e6\n", r"\[joms\]: order_gap_timeout must be at most"),
        ("[joms]\nmax_pending = 1000000000000\n", r"\[joms\]: max_pending must be at most"),
        # every send with expiration 0 was refused by the core at run time
        ("[joms]\ndefault_ttl = 1e7\n", r"default_ttl \(10000000.0 s\) must be at most node"),
    ],
)
def test_config_errors_are_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(cfg.ConfigError, match=message) as info:
        cfg.load(f)
    assert "\n" not in str(info.value)


def test_the_smallest_sizes_accepted_leave_room_for_a_publication(tmp_path: Path) -> None:
    """max_payload = min(max_message_size, cache_capacity) - PUBLISH_MARGIN must be at
    least 1 byte for every configuration the daemon accepts."""
    margin = cfg.PUBLISH_MARGIN
    with pytest.raises(cfg.ConfigError, match="max_message_size") as info:
        _load_limits(tmp_path, margin)
    assert str(info.value).count("\n") == 0
    c = _load_limits(tmp_path, margin + 1)
    assert c.limits["max_message_size"] == margin + 1
    assert cfg.LIMIT_RANGES["max_message_size"][0] - margin >= 1
    assert cfg.NODE_RANGES["cache_capacity"][0] - margin >= 1


def test_the_smallest_max_datagram_accepted_leaves_room_for_a_publication(
    tmp_path: Path,
) -> None:
    """The documented minimum of max_datagram once refused every publication ("descriptor
    leaves only 40 bytes per fragment in a 256-byte datagram"): at the minimum, a host with
    the longest host id, signing its messages, still publishes a small and a large
    payload with a few attributes; below it the daemon refuses to start, in one line."""
    low = int(cfg.NODE_RANGES["max_datagram"][0])
    f = tmp_path / "dg.toml"
    f.write_text(f"[node]\nmax_datagram = {low - 1}\n")
    with pytest.raises(cfg.ConfigError, match=r"node\.max_datagram = \d+ is out of range") as info:
        cfg.load(f)
    assert "\n" not in str(info.value)
    f.write_text(f"[node]\nmax_datagram = {low}\n")
    conf = cfg.load(f)
    assert conf.node["max_datagram"] == low
    for host_id in ("h", "h" * 64):
        for key in (None, bytes(range(32))):
            node = Node(conf.node_config(host_id, signing_key=key), rng=random.Random(1))
            for size in (1, 200_000):
                node.publish(
                    {"topic": "weather/alerts", "lang": "fr"},
                    random.Random(size).randbytes(size),
                    deadline=1e9 + 3600,
                    now=1e9,
                )


def _load_limits(tmp_path: Path, max_message_size: int) -> cfg.DaemonConfig:
    f = tmp_path / "limits.toml"
    f.write_text(f"[node.limits]\nmax_message_size = {max_message_size}\n")
    return cfg.load(f)


def test_config_missing_file_and_bad_node_values(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="does not exist"):
        cfg.load(tmp_path / "none.toml")
    with pytest.raises(cfg.ConfigError, match="horizon"):
        cfg.load(None, {"horizon": 0}).node_config("h")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"exec_concurrency": 5000}, r"exec_concurrency = 5000 is out of range \(1 … 1024\)$"),
        (
            {"bitrate": 200_000_000_000},
            r"bitrate = 200000000000 is out of range \(0 … 100000000000\)$",
        ),
        ({"horizon": 9}, r"node.horizon = 9 is out of range \(1 … 8\)$"),
        ({"follow_window": 1000}, r"follow_window = 1000 is out of range \(64 KiB … 64 GiB\)$"),
        ({"cache_capacity": 1}, r"cache_capacity = 1 is out of range \(64 KiB … 1 TiB\)$"),
    ],
)
def test_ranges_show_binary_units_only_for_byte_sizes(
    overrides: dict[str, int], message: str
) -> None:
    """1024 commands or 1024 bits/s are not '1 KiB': only byte sizes get units."""
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.load(None, overrides)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # printed with :g, the value was rounded to the bound it exceeds: "bitrate = 1e+11"
        ("bitrate = 100000000001", "bitrate = 100000000001 is out of range (0 … 100000000000)"),
        ("exec_timeout = 86400.25", "exec_timeout = 86400.25 is out of range (0 … 86400)"),
        (
            "[node]\nannounce_period = 80000.5\nneighbour_timeout = 80000.25",
            "node.neighbour_timeout (80000.25 s) must be 0 (3 × announce_period) or longer "
            "than node.announce_period (80000.5 s)",
        ),
        (
            "[joms]\ndefault_ttl = 604800.5",
            "[joms] default_ttl (604800.5 s) must be at most node.limits.max_ttl (604800 s)",
        ),
    ],
)
def test_range_errors_show_the_value_as_given(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text + "\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(f)
    assert message in str(info.value)


def test_as_given_writes_ints_in_full_and_floats_exactly() -> None:
    from dodwan.units import as_given

    assert as_given(100_000_000_001) == "100000000001"
    assert as_given(0.1 + 0.2) == "0.30000000000000004"
    assert as_given(1234567.5) == "1234567.5" and as_given(3.0) == "3.0"


def test_the_docs_table_shows_units_only_for_byte_sizes() -> None:
    ranged = {**cfg.RANGES, **cfg.NODE_RANGES, **cfg.LIMIT_RANGES}
    assert set(ranged) >= cfg.BYTE_SIZES
    doc = cfg.render_markdown()

    def range_cell(name: str) -> str:
        (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{name}` |")]
        return row.split("|")[3].strip()

    # counts, bits per second, instructions: plain numbers
    assert range_cell("exec_concurrency") == "1 … 1024"
    assert range_cell("bitrate") == "0 … 100000000000"
    assert range_cell("request_window") == "1 … 65536"
    assert range_cell("max_attributes") == "16 … 65536"
    assert range_cell("max_neighbours") == "2 … 1048576"
    assert range_cell("max_profile_program") == "16 … 16777216"
    for name in set(ranged) - cfg.BYTE_SIZES:
        assert "iB" not in range_cell(name), name
    # byte sizes: binary units
    assert range_cell("cache_capacity") == "64 KiB … 1 TiB"
    assert range_cell("max_descriptor_bytes") == "1 KiB … 1 MiB"
    assert range_cell("max_inflation_total") == "1 MiB … 1024 TiB"


def test_configuration_doc_is_generated_from_the_settings() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == cfg.render_markdown()
    for s in cfg.SETTINGS:
        assert f"`{s.name}`" in doc
    for name in cfg.NODE_FIELDS:
        assert f"`{name}`" in doc


# ---------------------------------------------------------------------- pacer


def test_token_bucket_paces_to_the_rate() -> None:
    b = TokenBucket(rate=1000.0, burst=1500.0, now=0.0)
    assert b.take(1500, 0.0)
    assert not b.take(1000, 0.0)
    assert b.wait(1000, 0.0) == pytest.approx(1.0)
    assert b.take(1000, 1.0)


def test_pacer_unlimited_sends_at_once_and_limited_spreads() -> None:
    sent: list[bytes] = []
    p = Pacer(sent.append, bitrate=0, burst=1, now=0.0)
    for i in range(5):
        p.push(bytes([i]) * 100)
    assert p.pump(0.0) is None and len(sent) == 5
    sent.clear()
    p = Pacer(sent.append, bitrate=8000, burst=1000, now=0.0)  # 1000 bytes/s
    for _ in range(5):
        p.push(b"x" * 500)
    delay = p.pump(0.0)
    assert len(sent) == 2 and delay == pytest.approx(0.5)
    assert p.pump(0.5) is not None and len(sent) == 3
    t, n = 0.5, 0
    while p.queued and n < 100:
        t += 0.5
        p.pump(t)
        n += 1
    assert len(sent) == 5 and t == pytest.approx(1.5)


def test_pacer_asks_the_node_for_only_what_keeps_the_link_busy() -> None:
    # The node keeps requested fragments and orders them itself; the pacer asks for what
    # keeps the link busy LOOKAHEAD ahead (at least one datagram), nothing when unpaced.
    assert Pacer(lambda d: None, bitrate=0, burst=1, now=0.0).ready_bytes(0.05) is None
    p = Pacer(lambda d: None, bitrate=8_000_000, burst=65536, now=0.0)  # 1 MB/s
    assert p.ready_bytes(0.05) == 50_000 + 1500
    for _ in range(30):
        p.push(b"x" * 1400)
    assert p.ready_bytes(0.05) == 50_000 + 1500 - 30 * 1400
    for _ in range(10):
        p.push(b"x" * 1400)
    assert p.ready_bytes(0.05) == 0  # more than enough queued already


def test_pacer_unlimited_hands_whole_batches_over_in_order() -> None:
    batches: list[list[bytes]] = []
    p = Pacer(lambda d: None, bitrate=0, burst=1, now=0.0, send_many=batches.append)
    p.push_many([b"a", b"b"])
    p.push(b"c")
    assert p.pump(0.0) is None
    assert batches == [[b"a", b"b", b"c"]] and p.sent == 3 and p.queued == 0
    limited: list[bytes] = []
    q = Pacer(limited.append, bitrate=8000, burst=1000, now=0.0, send_many=batches.append)
    q.push_many([b"x" * 600, b"y" * 600])
    assert q.pump(0.0) is not None and limited == [b"x" * 600]  # the bit rate still holds
    assert len(batches) == 1


def test_pacer_queue_is_bounded() -> None:
    p = Pacer(lambda d: None, bitrate=8, burst=1, now=0.0, max_queue=3)
    for i in range(5):
        p.push(bytes([i]))
    assert p.queued == 3 and p.dropped == 2
    p.push_many([b"y"] * 4)
    assert p.queued == 3 and p.dropped == 6


# ---------------------------------------------------------------------- media


def test_media_follow_the_group_address() -> None:
    assert medium_for("239.255.42.42:8500", "lo").kind == "multicast4"
    assert medium_for("255.255.255.255:8500", "eth0").kind == "broadcast4"
    assert medium_for("10.0.0.255:8500", "eth0").kind == "broadcast4"
    m6 = medium_for("[ff02::4242]:8500", "eth0")
    assert (m6.kind, m6.group, m6.port) == ("multicast6", "ff02::4242", 8500)


@pytest.mark.parametrize(
    "bad",
    [
        "239.1.1.1",
        "239.1.1.1:0",
        "nonsense:80",
        "[ff05::1]:80",
        "[2001:db8::1]:80",
        "0.0.0.0:1",
        "1.2.3.4:x",
    ],
)
def test_bad_groups_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="bad"):
        medium_for(bad, "lo")


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:61613") == ("::1", 61613)
    with pytest.raises(ValueError, match="between"):
        parse_address("127.0.0.1:70000")


# ---------------------------------------------------------------------- sinks


def test_dir_sink_writes_payload_and_descriptor(tmp_path: Path) -> None:
    ev = MessageDelivered("k", {"id": "h-1", "topic": "t"}, b"\x00payload")
    p = write_to_dir(tmp_path / "o", ev)
    assert p.read_bytes() == b"\x00payload"
    assert json.loads((tmp_path / "o" / "h-1.json").read_text()) == {"id": "h-1", "topic": "t"}


def test_file_names_cannot_escape_the_directory() -> None:
    for mid in ["../../etc/passwd", "a/b", ".hidden", "x.json"]:
        name = file_name(mid)
        assert "/" not in name and not name.startswith(".") and name != mid
    assert file_name("host-0123abcd") == "host-0123abcd"


def _longest_name(outdir: Path, msg_id: str) -> int:
    """Bytes of the longest file name a dir sink makes for ``msg_id`` (its temporaries)."""
    return len(f".{file_name(msg_id)}.json.tmp".encode())


def test_file_names_of_long_escaped_ids_fit_and_stay_unique(tmp_path: Path) -> None:
    """Ids are up to 128 printable characters; escaped, a non-ASCII one grows to 6 or 12
    bytes a character, and a name over 255 bytes can never be written (issue: ENAMETOOLONG
    retried forever)."""
    ids = ["ü" * 128, "ü" * 127 + "x", "𝄞" * 128, "a/" * 64, "ü" * 42]
    names = [file_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert names == [file_name(i) for i in ids]  # deterministic: a redelivery finds it
    for msg_id, name in zip(ids, names, strict=True):
        assert _longest_name(tmp_path, msg_id) <= 255, name
        assert "/" not in name and not name.startswith(".")
        ev = MessageDelivered("k", {"id": msg_id}, b"body")
        assert write_to_dir(tmp_path / "o", ev).read_bytes() == b"body"
        assert json.loads((tmp_path / "o" / f"{name}.json").read_text()) == {"id": msg_id}
    # Names that fitted before are unchanged (existing directories see no difference).
    assert file_name("ü" * 40) == "%" + "%C3%BC" * 40
    assert file_name("x" * 128) == "x" * 128


def test_a_dir_sink_delivers_a_long_escaped_id_at_once(tmp_path: Path) -> None:
    import asyncio

    from dodwan.daemon.sinks import SinkRouter

    done: list[MessageDelivered] = []
    ev = MessageDelivered("k", {"id": "ü" * 128}, b"body")

    async def main() -> SinkRouter:
        router = SinkRouter(on_done=done.append)
        router.set("k", "dir", str(tmp_path / "o"))
        router.deliver(ev)
        await router.close()
        return router

    router = asyncio.run(main())
    assert done == [ev]
    assert router.counters == {"deliveries_dir": 1}
    assert (tmp_path / "o" / file_name("ü" * 128)).read_bytes() == b"body"


def test_a_dir_write_that_can_never_succeed_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENAMETOOLONG does not depend on the directory's state: retrying cannot help. It is
    logged and counted once, and recorded finished (a restart would fail the same way)."""
    import asyncio
    import errno

    from dodwan.daemon import sinks

    def too_long(outdir: Path, ev: MessageDelivered) -> Path:
        raise OSError(errno.ENAMETOOLONG, "File name too long")

    monkeypatch.setattr(sinks, "write_to_dir", too_long)
    done: list[MessageDelivered] = []
    ev = MessageDelivered("k", {"id": "m"}, b"body")

    async def main() -> sinks.SinkRouter:
        router = sinks.SinkRouter(on_done=done.append)
        router.set("k", "dir", str(tmp_path / "o"))
        router.deliver(ev)
        await router.close()
        return router

    router = asyncio.run(main())
    assert router.counters == {"errors": 1}
    assert router._retrying == 0
    assert done == [ev]


def test_close_kills_a_command_that_ignores_sigterm_and_runs_no_queued_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to the command's process group, SIGKILL after the grace period; neither the
    stopped command nor the one waiting for a slot is recorded finished (both are redone
    at the next start)."""
    import asyncio
    import time

    from test_daemon_helpers import group_alive, wait_for

    from dodwan.daemon import sinks

    monkeypatch.setattr(sinks, "EXEC_STOP_GRACE", 0.5)
    pids = tmp_path / "pids"
    done: list[MessageDelivered] = []

    async def main() -> tuple[sinks.SinkRouter, float]:
        router = sinks.SinkRouter(exec_concurrency=1, on_done=done.append)
        router.set("k", "exec", f"trap '' TERM; echo $$ >> {pids}; sleep 60")
        router.deliver(MessageDelivered("k", {"id": "m1"}, b""))
        router.deliver(MessageDelivered("k", {"id": "m2"}, b""))  # waits for the slot
        deadline = time.monotonic() + 10
        while not (
            pids.exists() and pids.read_text().endswith("\n") and group_alive(int(pids.read_text()))
        ):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.02)
        started = time.monotonic()
        await router.close()
        return router, time.monotonic() - started

    router, took = asyncio.run(main())
    assert pids.read_text().count("\n") == 1  # m2 never ran
    # SIGKILL went to the whole group; under load its last member can take a moment to
    # finish dying after the shell was reaped (seen once in CI)
    pgid = int(pids.read_text())
    wait_for(lambda: not group_alive(pgid), timeout=5, what="the command's group to die")
    assert took < 5
    assert done == [] and "errors" not in router.counters


def test_exec_environment_carries_the_descriptor() -> None:
    ev = MessageDelivered("k", {"id": "m", "my-attr": "v"}, b"")
    env = exec_environment(ev, {"PATH": "/bin"})
    assert env["DODWAN_ID"] == "m" and env["DODWAN_ATTR_MY_ATTR"] == "v"
    assert json.loads(env["DODWAN_DESCRIPTOR"]) == {"id": "m", "my-attr": "v"}
    assert env["PATH"] == "/bin" and env["DODWAN_SUBSCRIPTION"] == "k"


def test_exec_environment_never_sets_a_variable_two_attributes_share() -> None:
    """``a-b``, ``a.b``, ``a b`` and ``A_B`` all gave DODWAN_ATTR_A_B: the last one won in
    silence. None of them is set now, and DODWAN_ATTRS_OMITTED names them; a variable the
    daemon inherited is never passed off as an attribute."""
    attrs = {"id": "m", "a-b": "1", "a.b": "2", "a b": "3", "A_B": "4", "nul": "x\x00y"}
    inherited = {"PATH": "/bin", "DODWAN_ATTR_STALE": "s", "DODWAN_REDELIVERED": "1"}
    env = exec_environment(MessageDelivered("k", attrs, b""), inherited)
    assert "DODWAN_ATTR_A_B" not in env and "DODWAN_ATTR_NUL" not in env
    assert json.loads(env["DODWAN_ATTRS_OMITTED"]) == ["A_B", "a b", "a-b", "a.b", "nul"]
    assert json.loads(env["DODWAN_DESCRIPTOR"]) == attrs
    assert {k for k in env if k.startswith("DODWAN_ATTR")} == {
        "DODWAN_ATTR_ID",
        "DODWAN_ATTRS_OMITTED",
    }
    assert "DODWAN_REDELIVERED" not in env and env["PATH"] == "/bin"
    plain = exec_environment(MessageDelivered("k", {"id": "m", "a-b": "1"}, b""), {})
    assert plain["DODWAN_ATTR_A_B"] == "1" and "DODWAN_ATTRS_OMITTED" not in plain


def test_store_batches_partial_fragments_but_commits_what_matters(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    s = SqliteStore(path, commit_delay=3600.0)
    s.put_message(MessageMeta("carried", b"z", 1, False, 1.0))
    s.put_fragment("carried", 0, b"partial")
    s.commit()  # only a partial set pending: kept open
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM fragments").fetchone()[0] == 0
    s.add_history("carried", "", 50.0)  # completion: must be durable now
    s.commit()
    assert other.execute("SELECT count(*) FROM fragments").fetchone()[0] == 1
    s.put_message(MessageMeta("mine", b"z", 0, True, 1.0))  # a local publication
    s.put_fragment("mine", 0, b"x")
    s.commit()
    assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    s.put_fragment("carried", 1, b"more")
    s.close()  # a clean close flushes what was pending
    assert other.execute("SELECT count(*) FROM fragments").fetchone()[0] == 3
    other.close()


def test_store_commit_delay_zero_commits_every_input(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    s = SqliteStore(path, commit_delay=0.0)
    s.put_fragment("m", 0, b"a")
    s.commit()
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM fragments").fetchone()[0] == 1
    assert s.commits == 1
    s.commit()  # nothing pending: no empty transaction
    assert s.commits == 1
    other.close()
    s.close()


def test_admin_api_doc_covers_every_endpoint() -> None:
    import re

    doc = (ROOT / "docs" / "admin-api.md").read_text()
    src = (ROOT / "dodwan" / "daemon" / "admin.py").read_text()
    paths = set(re.findall(r'"(/[a-z]+)"', src))
    assert {"/status", "/peers", "/metrics", "/publish", "/subscribe", "/follow"} <= paths
    for p in paths:
        assert f"{p}" in doc, p
    for route in ("DELETE /subscriptions/KEY", "GET /cache/ID", "DELETE /cache/ID"):
        assert route in doc


def test_store_fragment_cache_is_bounded_and_consistent(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "c.db", fragment_cache=3000)
    for i in range(5):
        s.put_fragment("m", i, bytes([i]) * 1000)
    assert s._frags_bytes <= 3000  # bounded: whole messages are evicted
    assert [s.get_fragment("m", i) for i in range(5)] == [bytes([i]) * 1000 for i in range(5)]
    s.put_fragment("m", 4, b"new")  # a rewrite replaces the cached copy
    assert s.get_fragment("m", 4) == b"new"
    s.delete_message("m")
    assert s.get_fragment("m", 4) is None and s.get_fragment("m", 0) is None
    assert s._frags_bytes == 0 and not s._frags
    s.close()


def test_store_fragments_evicted_before_their_commit_are_still_read(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "e.db", fragment_cache=2500, commit_delay=60.0)
    for i in range(3):
        s.put_fragment("a", i, b"a" * 1000)
    s.put_fragment("b", 0, b"b" * 1000)  # evicts message a from memory, uncommitted
    assert "a" not in s._frags
    assert [s.get_fragment("a", i) for i in range(3)] == [b"a" * 1000] * 3
    s.delete_message("b")  # a pending fragment of a deleted message is never written
    s.flush()
    assert s.get_fragment("b", 0) is None
    rows = s.conn.execute("SELECT msg_id, idx FROM fragments ORDER BY msg_id, idx").fetchall()
    assert rows == [("a", 0), ("a", 1), ("a", 2)]
    s.close()


def test_store_put_fragments_writes_a_whole_publication(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    s = SqliteStore(path, fragment_cache=10_000)
    s.put_message(MessageMeta("m", b"z", 0, True, 1.0))
    s.put_fragments("m", [b"a" * 10, b"b" * 10, b"c" * 3])
    s.commit()  # a local publication is committed at once
    other = sqlite3.connect(path)
    rows = other.execute("SELECT idx, data FROM fragments ORDER BY idx").fetchall()
    assert rows == [(0, b"a" * 10), (1, b"b" * 10), (2, b"c" * 3)]
    other.close()
    assert s.get_fragment("m", 2) == b"c" * 3 and s._frags_bytes == 23
    s.put_fragments("big", [b"x" * 6000, b"y" * 6000])  # larger than the cache: not kept
    assert "big" not in s._frags and s.get_fragment("big", 1) == b"y" * 6000
    s.close()


def _rows(path: Path, table: str) -> list[str]:
    other = sqlite3.connect(path)
    try:
        return [r[0] for r in other.execute(f"SELECT msg_id FROM {table} ORDER BY msg_id")]
    finally:
        other.close()


def test_store_keeps_volatile_publications_in_memory_only(tmp_path: Path) -> None:
    """A publication made inside ``volatile()`` (JOMS: a NON_PERSISTENT message) has no
    row — message, fragments, deliveries — yet reads like the others until it is deleted;
    it is gone after a restart. A persistent one beside it is stored as before."""
    path = tmp_path / "v.db"
    s = SqliteStore(path)
    with s.volatile():
        s.put_message(MessageMeta("np", b"zd", 0, True, 1.0))
        s.put_fragments("np", [b"a" * 10, b"b" * 3])
        s.add_history("np", "joms:t:1", 99.0)
    s.put_message(MessageMeta("p", b"zd", 0, True, 1.0))  # outside: stored
    s.put_fragments("p", [b"c"])
    s.add_history("p", "joms:t:1", 99.0)
    s.commit()
    assert _rows(path, "messages") == ["p"] and _rows(path, "fragments") == ["p"]
    assert _rows(path, "history") == ["p"]
    assert s.is_volatile("np") and not s.is_volatile("p")
    assert s.get_fragment("np", 1) == b"b" * 3 and s.get_fragment("np", 2) is None
    assert s.volatile_bytes == 2 + 13
    s.delete_message("np")
    assert s.volatile_bytes == 0 and s.get_fragment("np", 0) is None
    with s.volatile():
        s.put_message(MessageMeta("np2", b"zd", 0, True, 1.0))
        s.put_fragments("np2", [b"d"])
    s.commit()
    s.conn.close()
    s2 = SqliteStore(path)
    assert [m.msg_id for m, _ in s2.iter_messages()] == ["p"]  # np2 did not survive
    assert s2.get_fragment("np2", 0) is None
    s2.close()


def test_store_stores_volatile_publications_beyond_its_memory_limit(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    s = SqliteStore(path, volatile_limit=100)
    with s.volatile():
        s.put_message(MessageMeta("a", b"z" * 10, 0, True, 1.0))
        s.put_fragments("a", [b"x" * 50])
        s.put_message(MessageMeta("b", b"z" * 10, 0, True, 1.0))
        s.put_fragments("b", [b"y" * 50])  # does not fit: stored after all
        s.put_message(MessageMeta("c", b"z" * 200, 0, True, 1.0))  # does not fit either
        s.put_fragments("c", [b"w"])
    s.commit()
    assert s.is_volatile("a") and not s.is_volatile("b") and not s.is_volatile("c")
    assert s.volatile_bytes == 60
    assert _rows(path, "messages") == ["b", "c"] and _rows(path, "fragments") == ["b", "c"]
    assert s.get_fragment("b", 0) == b"y" * 50 and s.get_fragment("a", 0) == b"x" * 50
    s.close()


def test_node_on_the_store_forgets_volatile_publications_at_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SqliteStore(path)
    n = Node(NodeConfig(host_id="h"), rng=random.Random(1), store=store)
    n.subscribe({"topic": "t"}, now=1.0, key="k")
    with store.volatile():
        np_id = n.publish({"topic": "t"}, b"gone", deadline=1000.0, now=1.0, persistent=False)
    p_id = n.publish({"topic": "t"}, b"kept", deadline=1000.0, now=1.0)
    got = [ev.payload for ev in iter(n.next_event, None) if isinstance(ev, MessageDelivered)]
    assert got == [b"gone", b"kept"]  # delivered alike
    assert n.cache_entry(np_id) is not None
    store.conn.close()  # as after kill -9: only what was committed
    n2 = Node(NodeConfig(host_id="h"), rng=random.Random(2), store=SqliteStore(path))
    assert n2.cache_entry(np_id) is None and n2.cache_entry(p_id) is not None


def test_store_checkpoints_in_the_background_and_bounds_the_log(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    wal = Path(str(path) + "-wal")
    s = SqliteStore(path, checkpoint_bytes=256 * 1024, wal_limit=2 * 1024 * 1024)
    assert s.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    reader = sqlite3.connect(path)
    peak = 0
    for m in range(40):  # 40 publications of 256 KiB, committed one by one
        s.put_message(MessageMeta(f"m{m}", b"z", 0, True, 1.0))
        s.put_fragments(f"m{m}", [bytes([m]) * 1024] * 256)
        s.commit()
        peak = max(peak, wal.stat().st_size)
        if m % 8 == 7:
            assert s._checkpointer is not None and s._checkpointer.wait_idle(30)
    assert s._checkpointer is not None and s._checkpointer.error is None
    assert s.checkpoints >= 10 and s._checkpointer.truncations >= 1
    assert peak < 8 * 1024 * 1024  # 10 MiB written; the log was emptied on the way
    count = reader.execute("SELECT count(*) FROM fragments").fetchone()[0]
    assert count == 40 * 256  # another connection sees every committed row
    reader.close()
    s.close()
    s2 = SqliteStore(path)
    assert s2.get_fragment("m39", 255) == bytes([39]) * 1024
    assert s2.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    s2.close()


def test_every_numeric_node_setting_and_limit_has_a_validated_range() -> None:
    from dataclasses import fields

    from dodwan.core.config import NodeConfig
    from dodwan.core.limits import Limits

    numeric = {
        f.name
        for f in fields(NodeConfig)
        if isinstance(f.default, int | float) and not isinstance(f.default, bool)
    }
    assert numeric <= set(cfg.NODE_RANGES)
    assert {f.name for f in fields(Limits)} == set(cfg.LIMIT_RANGES)


def test_store_hold_groups_the_commits_made_inside_into_one(tmp_path: Path) -> None:
    """A gateway's run of SENDs: each publication's commit waits for the hold to end,
    then all are durable in one transaction (and nothing is before)."""
    path = tmp_path / "h.db"
    s = SqliteStore(path, commit_delay=0.0)
    other = sqlite3.connect(path)
    with s.hold():
        for i in range(5):
            s.put_message(MessageMeta(f"m{i}", b"z", 0, True, 1.0))  # local publications
            s.commit()
        with s.hold():  # nested: still the outer one's transaction
            s.put_message(MessageMeta("m5", b"z", 0, True, 1.0))
            s.commit()
        assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
        assert s.commits == 0
    assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 6
    assert s.commits == 1
    s.put_message(MessageMeta("m6", b"z", 0, True, 1.0))
    s.commit()  # outside a hold: at once, as before
    assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 7
    other.close()
    s.close()
