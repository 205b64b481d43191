"""The network key: sealing, replay window, key files, and real daemons with and without it."""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

from dodwan.cli import cli
from dodwan.daemon import netkey as nk

FAST = ["--announce-period", "0.5"]


# ---------------------------------------------------------------------- unit


@pytest.mark.parametrize("mode", ["auth", "encrypt"])
def test_sealed_datagrams_open_once_with_the_same_key(mode: str) -> None:
    key = nk.generate_key()
    a, b = nk.NetKey(key, mode), nk.NetKey(key, mode)
    data = b"DW\x01\x01hello"
    sealed = a.seal(data)
    assert len(sealed) == len(data) + nk.OVERHEAD
    assert (data in sealed) == (mode == "auth")
    assert b.open(sealed) == data
    assert b.open(sealed) is None and b.replayed == 1
    other = nk.NetKey(nk.generate_key(), mode)
    assert other.open(a.seal(data)) is None and other.rejected == 1


def test_tampered_truncated_and_foreign_datagrams_are_rejected() -> None:
    key = nk.generate_key()
    a, b = nk.NetKey(key), nk.NetKey(key, "auth")  # the mode byte travels: both open
    sealed = a.seal(b"payload bytes")
    for i in range(len(sealed)):
        bad = bytearray(sealed)
        bad[i] ^= 0x40
        assert b.open(bytes(bad)) is None
    assert b.open(sealed[:-1]) is None
    assert b.open(b"DW\x01\x01plain core datagram, no key") is None
    assert b.open(b"") is None
    assert b.rejected == len(sealed) + 3 and b.replayed == 0
    assert b.open(sealed) == b"payload bytes"  # the untouched one still opens


def test_replay_window_accepts_reordering_and_refuses_old_or_seen() -> None:
    key = nk.generate_key()
    a, b = nk.NetKey(key), nk.NetKey(key)
    sealed = [a.seal(bytes([i % 256])) for i in range(nk.WINDOW + 10)]
    assert b.open(sealed[5]) is not None
    assert b.open(sealed[2]) is not None  # late but inside the window
    assert b.open(sealed[2]) is None
    assert b.open(sealed[-1]) is not None  # jumps ahead: 0..9 fall out of the window
    assert b.open(sealed[3]) is None
    assert b.open(sealed[20]) is not None
    assert b.replayed == 2 and b.rejected == 0


def test_sender_table_is_bounded() -> None:
    key = nk.generate_key()
    rx = nk.NetKey(key, max_senders=8)
    for _ in range(50):
        assert rx.open(nk.NetKey(key).seal(b"x")) == b"x"
    assert rx.senders == 8


def test_keys_parse_from_base64_and_hex_only(tmp_path: Path) -> None:
    key = nk.generate_key()
    assert nk.parse_key(nk.encode_key(key)) == key
    assert nk.parse_key(key.hex() + "\n") == key
    for bad in ("", "abc", key.hex()[:-2], nk.encode_key(key[:16])):
        with pytest.raises(nk.NetKeyError):
            nk.parse_key(bad)
    with pytest.raises(nk.NetKeyError, match="does not exist"):
        nk.read_key_file(tmp_path / "none")


def test_keygen_writes_an_owner_only_key_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "net.key"
    r = CliRunner().invoke(cli, ["keygen", str(path)])
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = nk.read_key_file(path)
    r = CliRunner().invoke(cli, ["keygen", str(path)])
    assert r.exit_code != 0 and "exists" in r.output and "Traceback" not in r.output
    assert nk.read_key_file(path) == first
    r = CliRunner().invoke(cli, ["keygen", "--force", str(path)])
    assert r.exit_code == 0 and nk.read_key_file(path) != first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_daemon_with_a_bad_key_file_exits_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    r = CliRunner().invoke(
        cli, ["daemon", "--state-dir", str(tmp_path / "s"), "--network-key", str(bad)]
    )
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert r.output.startswith("Error: --network-key") and len(r.output.splitlines()) == 1


# ---------------------------------------------------------------------- daemons


class _Capture:
    """Joins the group on loopback and keeps every datagram heard (a passive eavesdropper)."""

    def __init__(self, group: str) -> None:
        host, port = group.rsplit(":", 1)
        self.dest = (host, int(port))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(self.dest)
        mreq = struct.pack("4s4s", socket.inet_aton(host), socket.inet_aton("127.0.0.1"))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        s.settimeout(0.2)
        self.sock = s
        self.heard: list[tuple[bytes, tuple[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.heard.append(self.sock.recvfrom(65535))
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def resend(self, datagrams: list[bytes]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            for d in datagrams:
                s.sendto(d, self.dest)
                time.sleep(0.001)


def test_only_hosts_with_the_key_take_part_and_replays_are_refused(daemons, tmp_path: Path) -> None:
    key, other = tmp_path / "net.key", tmp_path / "other.key"
    for path in (key, other):
        assert CliRunner().invoke(cli, ["keygen", str(path)]).exit_code == 0
    group = random_group()
    cap = _Capture(group)
    try:
        a = daemons("a", "--group", group, "--host-id", "a", "--network-key", str(key), *FAST)
        b = daemons("b", "--group", group, "--host-id", "b", "--network-key", str(key),
                    "--network-key-mode", "auth", *FAST)  # fmt: skip
        c = daemons("c", "--group", group, "--host-id", "c", *FAST)
        d = daemons("d", "--group", group, "--host-id", "d", "--network-key", str(other), *FAST)
        outs = {n: tmp_path / f"out-{n}" for n in "bcd"}
        for name, proc in (("b", b), ("c", c), ("d", d)):
            proc.client().post(
                "/subscribe",
                {
                    "patterns": [{"topic": "k.*"}],
                    "sink": {"kind": "dir", "target": str(outs[name])},
                },
            )
        wait_for(lambda: a.status()["neighbours"] == ["b"], what="a hears b only")
        seen_by_b = len(cap.heard)  # a's datagrams from now on have reached b
        mid = a.client().post(
            "/publish", {"attributes": {"topic": "keyed"}, "text": "for key holders", "ttl": 60}
        )["id"]
        wait_for(lambda: (outs["b"] / f"{mid}.json").exists(), what="delivery to b")
        assert (outs["b"] / mid).read_text() == "for key holders"
        start = a.status()["counters"]["announcements_sent"]
        wait_for(
            lambda: a.status()["counters"]["announcements_sent"] >= start + 4,
            what="a few more rounds",
        )
        assert list(outs["c"].iterdir()) == [] and list(outs["d"].iterdir()) == []
        assert c.status()["neighbours"] == [] and d.status()["neighbours"] == []
        for proc in (a, b):
            counters = proc.status()["counters"]
            assert counters["netkey_rejected"] > 0  # c's and d's datagrams
            assert counters.get("datagrams_dropped", 0) == 0  # they never reached the core
        # The sealed datagrams carry nothing readable for c; its core drops them.
        assert c.status()["counters"].get("datagrams_dropped", 0) > 0
        metrics = b.client().get("/metrics")
        assert 'dodwan_events_total{name="netkey_rejected"}' in metrics
        assert 'dodwan_events_total{name="netkey_replayed"}' in metrics

        # Replay what an eavesdropper captured from a: b refuses every copy.
        a_addr = tuple(a.status()["medium"]["local_address"])
        sealed = [x for x, addr in cap.heard[seen_by_b:] if addr == a_addr][:200]
        assert len(sealed) >= 4 and all(x[:2] == nk.MAGIC for x in sealed)
        assert all(b"for key holders" not in x for x in sealed)  # a encrypts
        before = b.status()["counters"]
        cap.resend(sealed)
        wait_for(
            lambda: (
                b.status()["counters"]["netkey_replayed"] - before["netkey_replayed"] == len(sealed)
            ),
            what="every replay counted",
        )
        after = b.status()["counters"]
        assert after.get("datagrams_dropped", 0) == 0
        assert after["messages_delivered"] == before["messages_delivered"]
    finally:
        cap.close()


def test_the_network_key_can_be_set_in_the_config_file(daemons, tmp_path: Path) -> None:
    key = tmp_path / "net.key"
    assert CliRunner().invoke(cli, ["keygen", str(key)]).exit_code == 0
    conf = tmp_path / "a.toml"
    conf.write_text(f'network_key = "{key}"\nnetwork_key_mode = "auth"\n')
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", "--config", str(conf), *FAST)
    b = daemons("b", "--group", group, "--host-id", "b", "--network-key", str(key), *FAST)
    c = daemons("c", "--group", group, "--host-id", "c", *FAST)
    # Only a key holder is heard by b: a's key came from its config file.
    wait_for(lambda: b.status()["neighbours"] == ["a"], what="b hears a")
    wait_for(lambda: a.status()["counters"].get("netkey_rejected", 0) > 0, what="c refused")
    assert a.status()["neighbours"] == ["b"] and c.status()["neighbours"] == []
    # the mode came from the file too; an open daemon says it has no key
    assert a.status()["medium"]["network_key"] == "auth"
    assert b.status()["medium"]["network_key"] == "encrypt"
    assert c.status()["medium"]["network_key"] is None


def test_pacing_charges_the_seal_overhead() -> None:
    from dodwan.daemon.pacer import Pacer

    for overhead, expected in ((0, 2), (nk.OVERHEAD, 1)):
        sent: list[bytes] = []
        p = Pacer(sent.append, bitrate=8.0, burst=100, now=0.0, overhead=overhead)
        p.push(b"x" * 50)
        p.push(b"y" * 50)
        p.pump(0.0)
        assert len(sent) == expected


def test_a_counter_jump_costs_constant_memory_and_time() -> None:
    # A key holder's datagram whose counter leapt to 2**33 or 2**62 used to shift the replay
    # bitmap that far: 9.3 s and 2.2 GB, or a MemoryError.
    key = nk.generate_key()
    a, b = nk.NetKey(key), nk.NetKey(key)
    assert b.open(a.seal(b"first")) is not None
    for jump in (2**33, 2**62, 2**63):
        a._counter = jump
        assert b.open(a.seal(b"late")) is not None
        state = next(iter(b._senders.values()))
        assert state.top == jump + 1 and state.bitmap.bit_length() <= nk.WINDOW
    assert b.open(a.seal(b"next")) is not None
    a._counter -= 2
    assert b.open(a.seal(b"replayed counter")) is None  # seen already
