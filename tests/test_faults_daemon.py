"""Local faults against real daemon processes: a refused second daemon, a full disk, a
damaged database, bad settings, and requests that used to leak internals.

Each test drives ``dodwan daemon`` processes and their real SQLite files; the disk-full
tests mount a 2 MB tmpfs (root only; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from brokers import Broker, free_port
from brokers import mosquitto as mosquitto
from click.testing import CliRunner, Result
from test_daemon_helpers import (
    DaemonProc,
    admin_auth,
    fill_disk,
    random_group,
    random_port,
    wait_for,
)
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import small_disk as small_disk

from dodwan.cli import cli
from dodwan.core import Node, NodeConfig
from dodwan.core.store import MessageMeta
from dodwan.daemon.client import AdminClient, ClientError
from dodwan.daemon.sqlite_store import SqliteStore


def _exits_with_one_line(proc: DaemonProc, timeout: float = 20.0) -> str:
    assert proc.proc is not None
    try:
        rc = proc.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"daemon kept running: {proc.log.read_text()[-2000:]}")
    text = proc.log.read_text().strip()
    assert rc != 0, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


def _ids(client: AdminClient) -> set[str]:
    return {e["descriptor"]["id"] for e in client.get("/cache")}


# ---------------------------------------------------------------------- 1. second daemon


def test_a_refused_second_daemon_leaves_the_running_ones_admin_file(daemons, tmp_path) -> None:
    a = daemons("a", "--group", random_group())
    before = (a.state_dir / "admin.json").read_text()
    second = DaemonProc(a.state_dir, ["--group", random_group()])
    second.log = tmp_path / "second.log"
    second.start(wait=False)
    text = _exits_with_one_line(second)
    assert "another daemon is running" in text
    assert (a.state_dir / "admin.json").read_text() == before
    r = CliRunner().invoke(cli, ["status", "--json", "--state-dir", str(a.state_dir)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["pid"] == a.proc.pid  # type: ignore[union-attr]


# ---------------------------------------------------------------------- 2. disk full


def test_store_rolls_back_a_failed_transaction_and_redoes_its_deletions(small_disk: Path) -> None:
    store = SqliteStore(small_disk / "d.db", checkpoint_bytes=0)
    store.put_message(MessageMeta("m1", b"z", 0, True, 1.0))
    store.put_fragments("m1", [b"a" * 1000])
    store.commit()
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    store.put_message(MessageMeta("m2", b"z", 0, True, 1.0))
    store.put_fragments("m2", [os.urandom(600_000)])
    store.commit()  # does not raise: the transaction is rolled back and m2 reported
    assert store.write_failures == 1 and "full" in store.last_error
    assert store.take_failed() == {"m2"} and store.take_failed() == set()
    store.delete_message("m1")  # the core dropped m1 too; on a full disk this fails as well
    store.commit()
    filler.unlink()
    store.put_message(MessageMeta("m3", b"z", 0, True, 1.0))
    store.commit()
    rows = {r[0] for r in store.conn.execute("SELECT msg_id FROM messages")}
    assert rows == {"m3"}  # m2 never stored, m1's deletion redone once there was room
    assert not list(store.conn.execute("SELECT 1 FROM fragments"))
    store.close()


def _received(outdir: Path) -> set[str]:
    return {p.name[: -len(".json")] for p in outdir.glob("*.json")}


@pytest.mark.timeout(180)
def test_disk_full_publication_is_durable_or_refused_and_never_sent(
    small_disk: Path, daemons, tmp_path: Path
) -> None:
    group = random_group()
    fast = ("--announce-period", "0.3")
    # The origin's state directory is on the 2 MB tmpfs; the subscriber's is not.
    a = DaemonProc(small_disk / "a", ["--group", group, *fast, "--host-id", "A"])
    a.log = tmp_path / "a.log"
    a.start()
    try:
        b = daemons("b", "--group", group, *fast, "--host-id", "B")
        out = tmp_path / "out"
        b.client().post("/subscribe", {"patterns": {"topic": "full"},
                                        "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        wait_for(lambda: "B" in a.client().get("/peers") and "A" in b.client().get("/peers"),
                 what="A and B neighbours")  # fmt: skip
        ok: list[str] = []
        failed: list[str] = []
        for _ in range(400):
            try:
                res = a.client().publish_bytes(os.urandom(8192), attributes={"topic": "full"})
                ok.append(res["id"])
            except ClientError as exc:
                failed.append(str(exc))
        assert ok and failed, (len(ok), failed[:3])
        print(f"disk full: {len(ok)} acknowledged, {len(failed)} refused ({failed[0]})")
        assert all("disk" in f and "not published" in f for f in failed), failed[:3]
        # What the origin says it holds is exactly what it acknowledged...
        assert _ids(a.client()) == set(ok)
        assert a.status()["cache"]["messages"] == len(ok)
        assert a.status()["counters"]["daemon_store_write_failures"] >= len(failed)
        # ...the subscriber receives those and nothing else...
        wait_for(lambda: _received(out) >= set(ok), timeout=60, what="acknowledged ones received")
        assert _received(out) == set(ok)
        # ...and they survive a restart.
        a.kill()
        a.start()
        assert _ids(a.client()) == set(ok)
    finally:
        a.kill()
    assert "Traceback" not in a.log.read_text()


@pytest.mark.timeout(180)
def test_disk_full_received_message_is_dropped_and_counted(
    small_disk: Path, daemons, tmp_path: Path
) -> None:
    group = random_group()
    fast = ("--announce-period", "0.3")
    a = daemons("a", "--group", group, *fast, "--host-id", "A")
    # The receiver's database is on the 2 MB tmpfs; its output directory is not.
    b = DaemonProc(small_disk / "b", ["--group", group, *fast, "--host-id", "B",
                                      "--fragment-commit-delay", "0"])  # fmt: skip
    b.log = tmp_path / "b.log"
    b.start()
    try:
        out = tmp_path / "out"
        b.client().post("/subscribe", {"patterns": {"topic": "full"},
                                        "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        wait_for(lambda: "B" in a.client().get("/peers"), what="A hears B")
        for _ in range(300):
            a.client().publish_bytes(os.urandom(8192), attributes={"topic": "full"})

        def settled() -> bool:
            # A write failure is counted when its transaction rolls back; the messages it
            # held are dropped, and counted, when B next handles input (or a write held
            # no message at all): on a loaded machine the first check can fall in between.
            # Wait for the drop itself, which is what this test asserts.
            c = b.status()["counters"]
            return (
                c.get("daemon_messages_dropped_store", 0) > 0 and c.get("messages_completed", 0) > 0
            )

        wait_for(settled, timeout=60, what="B filled its disk and dropped a message")
        a.kill()  # nothing more arrives: what B holds now is final
        b.client().get("/status")  # B has handled what was in flight before this request
        b_listing = b.client().get("/cache")
        held = {e["descriptor"]["id"] for e in b_listing}
        counters = b.status()["counters"]
        assert counters["daemon_messages_dropped_store"] > 0
        print(f"disk full (receiver): {len(held)} held, "
              f"{counters['daemon_messages_dropped_store']} dropped")  # fmt: skip
        # Every delivered message is one B holds (not half-kept), durably: a copy of B's
        # state directory (its disk is full) started on a group of its own holds the same.
        assert _received(out) <= held
        b.kill()
        copy = tmp_path / "b-copy"
        shutil.copytree(b.state_dir, copy)
        again = daemons("b-copy", "--group", random_group())
        assert again.state_dir == copy
        after = {e["descriptor"]["id"]: e["complete"] for e in again.client().get("/cache")}
        assert {k for k, done in after.items() if done} == {
            e["descriptor"]["id"] for e in b_listing if e["complete"]
        }
        # A partial message whose deletion could not be written either (the disk is still
        # full) may come back as partial: it is fetched again, never delivered half.
        assert all(not after[k] for k in set(after) - held)
    finally:
        b.kill()
    assert "Traceback" not in b.log.read_text()


def _status_of(d: DaemonProc, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    """(HTTP status, error message or body) of one admin request."""
    port = json.loads((d.state_dir / "admin.json").read_text())["port"]
    status, text = _raw_http(
        port,
        f"{method} {path} HTTP/1.1\r\nContent-Type: application/json\r\n".encode()
        + admin_auth(d.state_dir)
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    try:
        return status, str(json.loads(text).get("error", text.decode()))
    except (ValueError, AttributeError):
        return status, text.decode(errors="replace")


def _sub_keys(d: DaemonProc) -> set[str]:
    return {s["key"] for s in d.client().get("/subscriptions")}


@pytest.mark.timeout(120)
def test_disk_full_unsubscribe_is_refused_and_the_subscription_kept(
    small_disk: Path, tmp_path: Path
) -> None:
    """An unsubscription the database cannot store is a 507 and changes nothing: the running
    daemon keeps delivering to the subscription, as its disk says it should after a restart
    (it used to answer 200 and drop it in memory only, to come back at the next start)."""
    a = DaemonProc(small_disk / "a", ["--group", random_group(), "--host-id", "A"])
    a.log = tmp_path / "a.log"
    a.start()
    out = tmp_path / "out"
    try:
        a.client().post("/subscribe", {"patterns": {"topic": "t"}, "key": "k",
                                        "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        filler = fill_disk(small_disk)
        status, error = _status_of(a, "DELETE", "/subscriptions/k")
        assert status == 507, (status, error)
        assert "cannot store" in error and "'k'" in error and "full" in error, error
        assert "k" in _sub_keys(a)
        filler.unlink()
        msg_id = a.client().post("/publish", {"attributes": {"topic": "t"}, "text": "hi"})["id"]
        wait_for(lambda: msg_id in _received(out), what="the kept subscription's sink delivers")
        a.kill()
        a.start()
        assert "k" in _sub_keys(a)
        assert a.client().delete("/subscriptions/k") == {"unsubscribed": "k"}
        a.kill()
        a.start()
        assert "k" not in _sub_keys(a)
    finally:
        a.kill()
    text = a.log.read_text()
    assert "Traceback" not in text
    assert "cannot store the removal of subscription 'k'" in text, text


@pytest.mark.timeout(180)
def test_disk_full_bridge_changes_are_refused_and_change_nothing(
    small_disk: Path, tmp_path: Path, mosquitto: Broker
) -> None:
    """``bridge rm``, ``bridge add`` and a replacement the disk cannot store are one-line
    507s and leave the bindings as they were, in the running daemon as after a restart
    (``bridge rm`` used to drop the binding and its subscription in memory, answer 500 with
    a traceback in the log, and have it back at the next start)."""
    a = DaemonProc(small_disk / "a", ["--group", random_group(), "--host-id", "A"])
    a.log = tmp_path / "a.log"
    a.start()

    def bindings() -> dict[str, dict[str, str]]:
        return {b["name"]: b["attributes"] for b in a.client().get("/bridges")}

    b1 = {"uri": mosquitto.url("faults/b1"), "name": "b1", "direction": "out",
          "attributes": {"topic": "x"}}  # fmt: skip
    try:
        a.client().post("/bridges", b1)
        wait_for(lambda: a.client().get("/bridges")[0]["connected"], what="b1 connected")
        filler = fill_disk(small_disk)
        status, error = _status_of(a, "DELETE", "/bridges/b1")
        assert status == 507, (status, error)
        assert "cannot store" in error and "'b1'" in error and "full" in error, error
        assert bindings() == {"b1": {"topic": "x"}} and "bridge:b1" in _sub_keys(a)
        b2 = {**b1, "name": "b2", "uri": mosquitto.url("faults/b2")}
        status, error = _status_of(a, "POST", "/bridges", json.dumps(b2).encode())
        assert status == 507, (status, error)
        assert "cannot store" in error and "'b2'" in error and "full" in error, error
        replacement = {**b1, "attributes": {"topic": "y"}, "replace": True}
        status, error = _status_of(a, "POST", "/bridges", json.dumps(replacement).encode())
        assert status == 507, (status, error)
        assert "cannot store" in error and "'b1'" in error and "full" in error, error
        assert bindings() == {"b1": {"topic": "x"}} and "bridge:b2" not in _sub_keys(a)
        wait_for(lambda: a.client().get("/bridges")[0]["connected"], what="b1 connected")
        filler.unlink()
        a.kill()
        a.start()
        assert bindings() == {"b1": {"topic": "x"}} and "bridge:b1" in _sub_keys(a)
        assert a.client().delete("/bridges/b1")["removed"] == "b1"
        assert bindings() == {} and "bridge:b1" not in _sub_keys(a)
        a.kill()
        a.start()
        assert bindings() == {} and "bridge:b1" not in _sub_keys(a)
    finally:
        a.kill()
    assert "Traceback" not in a.log.read_text()


class _Stomp:
    """A raw STOMP 1.2 client connection (frames as the gateway sends them)."""

    def __init__(self, port: int, client_id: str) -> None:
        from joms.stomp.frame import Frame, FrameParser

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.parser = FrameParser()
        self.pending: list[Frame] = []
        self.send(Frame("CONNECT", {"accept-version": "1.2", "host": "A",
                                    "client-id": client_id}))  # fmt: skip
        assert self.next().command == "CONNECTED"

    def send(self, frame: Any) -> None:
        from joms.stomp.frame import encode

        self.sock.sendall(encode(frame))

    def next(self) -> Any:
        """The next frame; None once the gateway closed the connection."""
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.pending.extend(self.parser.feed(data))
        return self.pending.pop(0)

    def request(self, command: str, headers: dict[str, str], body: bytes = b"") -> Any:
        from joms.stomp.frame import Frame

        self.send(Frame(command, {**headers, "receipt": "r"}, body))
        return self.next()

    def close(self) -> None:
        self.sock.close()


def _stomp_daemon_on(disk: Path, tmp_path: Path) -> tuple[DaemonProc, int]:
    """A daemon serving STOMP whose state directory is on ``disk`` (its log elsewhere)."""
    port = free_port()
    a = DaemonProc(
        disk / "a", ["--group", random_group(), "--host-id", "A", "--stomp", f"127.0.0.1:{port}"]
    )
    a.log = tmp_path / "a.log"
    a.start()
    return a, port


@pytest.mark.timeout(120)
def test_disk_full_joms_durable_subscribe_is_a_resource_error_and_the_gateway_goes_on(
    small_disk: Path, tmp_path: Path
) -> None:
    """A durable SUBSCRIBE whose JOMS state (joms.sqlite) cannot be stored is answered with
    an ERROR saying so (ResourceAllocationException, as a SEND dodwan.db cannot store), the
    connection's end on the full disk is one log line, and once there is room the gateway
    serves as before, the state kept meanwhile written too (a traceback per failure, and
    ``internal error storing the frames: OperationalError``, before)."""
    a, port = _stomp_daemon_on(small_disk, tmp_path)
    news = {"destination": "/topic/news"}
    try:
        c1 = _Stomp(port, "c1")
        ok = c1.request("SUBSCRIBE", {**news, "id": "0", "durable-subscription-name": "d0"})
        assert ok.command == "RECEIPT", ok
        c2 = _Stomp(port, "c2")
        filler = fill_disk(small_disk)
        f = c2.request("SUBSCRIBE", {**news, "id": "0", "durable-subscription-name": "d1"})
        assert f.command == "ERROR", f
        assert f.headers.get("joms-exception") == "ResourceAllocationException", f.headers
        assert "cannot store" in f.headers["message"] and "full" in f.headers["message"], f
        assert c2.next() is None  # closed by the gateway: its end is handled on the full disk
        c2.close()
        filler.unlink()
        c3 = _Stomp(port, "c3")
        ok = c3.request("SEND", news, b"after")
        assert ok.command == "RECEIPT", ok
        got = c1.next()
        assert got.command == "MESSAGE" and got.body == b"after", got
        c2 = _Stomp(port, "c2")
        first = c2.request("SUBSCRIBE", {**news, "id": "0", "durable-subscription-name": "d1"})
        # d1 exists since the refused SUBSCRIBE (kept in memory, stored once there was
        # room): it kept the message, sent with the receipt
        got = {f.command: f for f in (first, c2.next())}
        assert set(got) == {"RECEIPT", "MESSAGE"}, got
        assert got["MESSAGE"].body == b"after"
        for c in (c1, c2, c3):
            c.close()
    finally:
        a.kill()
    text = a.log.read_text()
    assert "Traceback" not in text, text
    assert "cannot write to" in text and "joms.sqlite" in text, text


def _stored_sub_keys(d: DaemonProc) -> set[str]:
    """Subscription keys in the daemon's dodwan.db (read-only, beside the running daemon)."""
    conn = sqlite3.connect(f"file:{d.state_dir / 'dodwan.db'}?mode=ro", uri=True)
    try:
        return {str(r[0]) for r in conn.execute("SELECT key FROM subscriptions")}
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_disk_full_joms_core_unsubscriptions_reach_the_database_once_there_is_room(
    small_disk: Path, tmp_path: Path
) -> None:
    """A JOMS consumer closing, or a durable subscription deleted, removes its core
    subscription in the running daemon at once; when dodwan.db cannot store the removal
    (disk full) it is redone by the next commit that succeeds, so the database agrees with
    the daemon once there is room. (It used to be rolled back for good: the subscriptions
    came back at the next start with no JOMS consumer behind them, still attracting
    messages.)"""
    import joms
    from joms.errors import ResourceAllocationException

    a, port = _stomp_daemon_on(small_disk, tmp_path)
    url = f"stomp://127.0.0.1:{port}"
    try:
        plain = joms.connect(url)
        s1 = plain.create_session()
        consumer = s1.create_consumer(s1.create_topic("news"))
        named = joms.connect(url, client_id="c2")
        s2 = named.create_session()
        s2.create_durable_subscriber(s2.create_topic("news"), "d0").close()
        before = _sub_keys(a)
        joms_keys = {k for k in before if k.startswith(("joms:t:", "joms:d:"))}
        assert len(joms_keys) == 2 and _stored_sub_keys(a) == before, before
        filler = fill_disk(small_disk)
        consumer.close()
        with pytest.raises(ResourceAllocationException):
            s2.unsubscribe("d0")  # JOMS keeps the deletion in memory, stored once there is room
        assert _sub_keys(a) == before - joms_keys  # gone from the running daemon at once
        filler.unlink()
        # Any commit that succeeds (here a JOMS one, which also writes joms.sqlite) ...
        after = joms.connect(url)
        s3 = after.create_session()
        s3.create_consumer(s3.create_topic("other")).close()
        after.close()
        # ... stores the removals: the database holds what the daemon holds
        wait_for(lambda: _stored_sub_keys(a) == _sub_keys(a),
                 what=lambda: f"dodwan.db {_stored_sub_keys(a)} == daemon {_sub_keys(a)}")  # fmt: skip
        for c in (plain, named):
            with contextlib.suppress(Exception):
                c.close()
        a.kill()
        a.start()
        left = {k for k in _sub_keys(a) if k.startswith(("joms:t:", "joms:d:"))}
        assert not left, left  # no core subscription without a JOMS consumer behind it
    finally:
        a.kill()
    assert "Traceback" not in a.log.read_text()


def _start_outcome(d: DaemonProc, timeout: float = 20.0) -> str:
    """'serving' once the daemon answers, or its one-line refusal (it must exit then)."""

    def settled() -> str | None:
        assert d.proc is not None
        if d.proc.poll() is not None:
            return "exited"
        with contextlib.suppress(OSError, ValueError, KeyError, ClientError):
            info = json.loads((d.state_dir / "admin.json").read_text())
            if info["pid"] == d.proc.pid and d.client().get("/status")["host_id"]:
                return "serving"
        return None

    if wait_for(settled, timeout, what="the daemon serves or exits") == "serving":
        return "serving"
    assert d.proc is not None and d.proc.returncode == 1, d.log.read_text()
    return _exits_with_one_line(d)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
@pytest.mark.parametrize("variant", ["plain", "stomp", "bridge"])
def test_a_start_on_a_full_disk_serves_or_is_one_line_and_keeps_what_is_stored(
    small_disk: Path, tmp_path: Path, variant: str, stop: int
) -> None:
    """A daemon started when the disk under its state directory is already full either
    serves (and reports the disk as it writes) or refuses with one line naming the disk,
    exit 1; what it stored before is intact once there is room. (A cleanly stopped
    dodwan.db was called damaged, with advice to repair it; the JOMS service's first commit
    on a full disk was a traceback.)"""
    args = ["--group", random_group(), "--host-id", "A"]
    if variant == "stomp":
        args += ["--stomp", f"127.0.0.1:{free_port()}"]
    elif variant == "bridge":
        config = tmp_path / "bridge.toml"
        config.write_text('[[bridges]]\nname = "b1"\nuri = "mqtt://127.0.0.1:1/t"\n'
                          'direction = "out"\nattributes = { topic = "x" }\n')  # fmt: skip
        args += ["--config", str(config)]
    a = DaemonProc(small_disk / "a", args)
    a.log = tmp_path / "a.log"
    a.start()
    try:
        a.client().post("/subscribe", {"patterns": {"topic": "t"}, "key": "k",
                                        "sink": {"kind": "dir", "target": str(tmp_path / "out")}})  # fmt: skip
        msg_id = a.client().post("/publish", {"attributes": {"topic": "t"}, "text": "hi"})["id"]
        keys = _sub_keys(a)
        a.kill(stop)
        filler = fill_disk(small_disk)
        a.log = tmp_path / "full.log"
        a.start(wait=False)
        outcome = _start_outcome(a)
        if outcome == "serving":
            assert "k" in _sub_keys(a) and msg_id in _ids(a.client())
        else:
            assert "damaged" not in outcome and "repair" not in outcome, outcome
            assert re.search(r"full|No space left", outcome), outcome
        a.kill()
        filler.unlink()
        r = CliRunner().invoke(cli, ["check", "--state-dir", str(a.state_dir)])
        assert r.exit_code == 0 and "ok" in r.output, r.output
        a.log = tmp_path / "after.log"
        a.start()
        assert _sub_keys(a) >= {k for k in keys if not k.startswith("joms:")}
        assert msg_id in _ids(a.client())
    finally:
        a.kill()
    for log_file in ("a.log", "full.log", "after.log"):
        assert "Traceback" not in (tmp_path / log_file).read_text(), log_file


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", [[], ["--stomp", "127.0.0.1:0"]], ids=["plain", "stomp"])
def test_a_fresh_state_directory_on_a_full_disk_is_one_line(
    small_disk: Path, tmp_path: Path, variant: list[str]
) -> None:
    filler = fill_disk(small_disk)
    a = DaemonProc(small_disk / "a", ["--group", random_group(), *variant])
    a.log = tmp_path / "a.log"
    try:
        a.start(wait=False)
        text = _exits_with_one_line(a)
        assert a.proc is not None and a.proc.returncode == 1
        assert "No space left on device" in text, text
    finally:
        a.kill()
    filler.unlink()
    a.log = tmp_path / "after.log"
    a.start()  # once there is room, the same directory serves
    a.kill()


# ---------------------------------------------------------------------- 3. integrity


def test_an_empty_database_file_is_refused_not_replaced(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "dodwan.db").write_bytes(b"")
    d = DaemonProc(state, ["--group", random_group()])
    d.start(wait=False)
    text = _exits_with_one_line(d)
    assert "dodwan.db" in text and "empty" in text and "dodwan repair" in text
    assert (state / "dodwan.db").stat().st_size == 0
    # The way out it names: repair keeps the empty file aside and makes a fresh database.
    r = CliRunner().invoke(cli, ["repair", "--state-dir", str(state)])
    assert r.exit_code == 0 and "saved 0 of 0 messages" in r.output, r.output
    assert [p.stat().st_size for p in state.glob("dodwan.db.damaged-*")] == [0]
    d.log.write_text("")
    try:
        d.start()
        assert d.status()["cache"]["messages"] == 0
    finally:
        d.kill()


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "dodwan.db").write_text("these are my notes\n" * 200)
    d = DaemonProc(state, ["--group", random_group()])
    d.start(wait=False)
    assert "not a DoDWAN database" in _exits_with_one_line(d)
    other = tmp_path / "t"
    other.mkdir()
    conn = sqlite3.connect(other / "dodwan.db")
    conn.execute("CREATE TABLE accounts(name TEXT)")
    conn.commit()
    conn.close()
    d = DaemonProc(other, ["--group", random_group()])
    d.start(wait=False)
    assert "not a DoDWAN database" in _exits_with_one_line(d)


def _damage(db: Path, nbytes: int = 16384, seed: int = 7) -> None:
    size = db.stat().st_size
    at = (size // 2) // 4096 * 4096
    with open(db, "r+b") as f:
        f.seek(at)
        f.write(random.Random(seed).randbytes(nbytes))


def test_damage_is_found_at_start_checked_and_repaired(daemons, tmp_path: Path) -> None:
    a = daemons("a", "--group", random_group())
    sent: dict[str, bytes] = {}
    for i in range(150):
        data = random.Random(i).randbytes(3000)
        sent[a.client().publish_bytes(data, attributes={"n": str(i)})["id"]] = data
    a.kill(15)  # clean stop: the log is checkpointed into dodwan.db
    db = a.state_dir / "dodwan.db"
    _damage(db)
    # Start-up refuses, naming the way out.
    a.log.write_text("")
    a.start(wait=False)
    text = _exits_with_one_line(a)
    assert "damaged" in text and "dodwan repair" in text
    # The full check says what is wrong.
    r = CliRunner().invoke(cli, ["check", "--state-dir", str(a.state_dir)])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert "damaged" in r.output
    # Repair salvages what is readable into a fresh database and says what it saved.
    r = CliRunner().invoke(cli, ["repair", "--state-dir", str(a.state_dir)])
    assert r.exit_code == 0, r.output
    m = re.search(r"saved (\d+) of (\d+) messages", r.output)
    assert m, r.output
    saved = int(m.group(1))
    assert 0 < saved <= len(sent)
    assert list(a.state_dir.glob("dodwan.db.damaged-*")), "the damaged file is kept aside"
    r = CliRunner().invoke(cli, ["check", "--state-dir", str(a.state_dir)])
    assert r.exit_code == 0, r.output
    a.start()
    held = _ids(a.client())
    assert len(held) == saved and held <= set(sent)
    for msg_id in held:  # every saved message is whole
        import base64

        got = a.client().get(f"/cache/{msg_id}?payload=1")
        assert base64.b64decode(got["payload_b64"]) == sent[msg_id]


@pytest.mark.timeout(120)
def test_damage_found_while_running_is_counted_not_a_traceback(daemons, tmp_path: Path) -> None:
    group = random_group()
    fast = ("--announce-period", "0.3", "--fragment-cache", "0")
    a = daemons("a", "--group", group, *fast, "--host-id", "A")
    ids = [
        a.client().publish_bytes(random.Random(i).randbytes(4000), attributes={"t": "x"})["id"]
        for i in range(1200)
    ]
    # Damage the file under the running daemon: 1 MiB of the 5 MB it holds, beyond what
    # SQLite's page cache (2 MB) keeps of it after a restart.
    a.kill(15)
    a.start()
    _damage(a.state_dir / "dodwan.db", 1 << 20)
    errors = 0
    for msg_id in ids:
        try:
            a.client().get(f"/cache/{msg_id}?payload=1")
        except ClientError as exc:
            assert "damaged" in str(exc) and "dodwan check" in str(exc), exc
            errors += 1
    assert errors > 0
    b = daemons("b", "--group", group, *fast, "--host-id", "B")
    b.client().post("/subscribe", {"patterns": {"t": "x"},
                                    "sink": {"kind": "dir", "target": str(tmp_path / "o")}})  # fmt: skip
    wait_for(lambda: a.status()["counters"].get("daemon_store_read_errors", 0) > 0,
             timeout=30, what="A failing to read fragments B asks for")  # fmt: skip
    assert a.alive


# ---------------------------------------------------------------------- 4. unusable state


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """``view(dir)``: a read-only bind mount of ``dir`` (unmounted at teardown).

    Root ignores permission bits, so a chmod would not make a directory read-only for these
    tests; a read-only mount does, for root too."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    mounts: list[Path] = []

    def view(src: Path) -> Path:
        target = src.with_name(src.name + "-ro")
        target.mkdir()
        subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(target)], check=True)
        mounts.append(target)
        with pytest.raises(OSError):  # really read-only
            (target / "probe").write_text("")
        return target

    yield view
    for target in reversed(mounts):
        subprocess.run(["umount", "-l", str(target)], check=False)


def _healthy_state(state: Path, messages: int = 3) -> None:
    """A state directory whose database holds ``messages`` complete local publications."""
    state.mkdir()
    store = SqliteStore(state / "dodwan.db")
    node = Node(NodeConfig(host_id="h"), rng=random.Random(1), store=store)
    now = time.time()
    for i in range(messages):
        node.publish({"n": str(i)}, random.Random(i).randbytes(3000), now + 3600, now)
    store.commit()
    store.close()
    (state / "daemon.lock").write_text("")  # as a daemon that ran there leaves it
    assert not Path(f"{state / 'dodwan.db'}-wal").exists()


def _one_line_error(r: Result) -> str:
    assert r.exit_code != 0, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)  # not a traceback
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def test_repair_of_a_read_only_state_directory_is_one_line(
    tmp_path: Path, read_only_view: Callable[[Path], Path]
) -> None:
    _healthy_state(tmp_path / "s")
    ro = read_only_view(tmp_path / "s")
    text = _one_line_error(CliRunner().invoke(cli, ["repair", "--state-dir", str(ro)]))
    assert "read-only" in text and str(ro) in text, text
    assert sorted(p.name for p in ro.iterdir()) == ["daemon.lock", "dodwan.db"]


def test_repair_with_a_directory_for_its_lock_file_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "s"
    (state / "daemon.lock").mkdir(parents=True)
    text = _one_line_error(CliRunner().invoke(cli, ["repair", "--state-dir", str(state)]))
    assert f"cannot lock {state / 'daemon.lock'}: Is a directory" in text, text


def test_check_of_a_healthy_database_on_a_read_only_mount_is_ok(
    tmp_path: Path, read_only_view: Callable[[Path], Path]
) -> None:
    _healthy_state(tmp_path / "s")
    ro = read_only_view(tmp_path / "s")
    r = CliRunner().invoke(cli, ["check", "--state-dir", str(ro)])
    assert r.exit_code == 0, r.output
    assert r.output == f"{ro / 'dodwan.db'}: ok (3 messages: 3 complete, 0 partial, 0 unreadable)\n"


def test_check_that_cannot_open_the_database_says_so_and_does_not_call_it_damaged(
    tmp_path: Path, read_only_view: Callable[[Path], Path]
) -> None:
    # A write-ahead log without its -shm file on a read-only mount: SQLite cannot open it
    # there (it would have to create the -shm file), and reading the database without the
    # log would check an out-of-date file. The database itself is fine.
    _healthy_state(tmp_path / "live")
    db = tmp_path / "live" / "dodwan.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT INTO meta(key, value) VALUES ('x', 'y')")
    conn.commit()
    state = tmp_path / "s"
    state.mkdir()
    for name in ("dodwan.db", "dodwan.db-wal"):  # as a copy taken while it was in use
        shutil.copyfile(tmp_path / "live" / name, state / name)
    conn.close()
    assert (state / "dodwan.db-wal").stat().st_size > 0
    ro = read_only_view(state)
    text = _one_line_error(CliRunner().invoke(cli, ["check", "--state-dir", str(ro)]))
    assert f"cannot open {ro / 'dodwan.db'} to check it" in text, text
    assert "damaged" not in text and "repair" not in text, text


@pytest.mark.parametrize("side", ["-wal", "-shm", "-journal"])
def test_check_with_a_directory_beside_the_database_names_it(tmp_path: Path, side: str) -> None:
    _healthy_state(tmp_path / "s")
    (tmp_path / "s" / f"dodwan.db{side}").mkdir()
    r = CliRunner().invoke(cli, ["check", "--state-dir", str(tmp_path / "s")])
    text = _one_line_error(r)
    assert f"{tmp_path / 's' / f'dodwan.db{side}'}: Is a directory" in text, text
    assert "damaged" not in text and "repair" not in text, text


STATE_FILES = [  # (file of the state directory, the options that make the daemon use it)
    ("daemon.lock", []),
    ("dodwan.db", []),
    ("dodwan.db-wal", []),
    ("dodwan.db-shm", []),
    ("dodwan.db-journal", []),
    ("admin.json", []),
    ("admin.json.tmp", []),
    ("bridges.db", []),
    ("bridges.db-wal", []),
    ("bridges.db-shm", []),
    ("trace.jsonl", ["--trace"]),
    ("admin.token", ["--admin", "127.0.0.2:0", "--allow-remote"]),  # 127.0.0.2: loopback
    ("joms.sqlite", ["--stomp", "127.0.0.1:0"]),
    ("joms.sqlite-wal", ["--stomp", "127.0.0.1:0"]),
    ("joms.sqlite-shm", ["--stomp", "127.0.0.1:0"]),
]


def _start(state: Path, args: list[str]) -> Result:
    """``dodwan daemon`` in this process: cheaper than a process per case, the same CLI."""
    return CliRunner().invoke(
        cli, ["daemon", "--state-dir", str(state), "--group", random_group(), *args]
    )


@pytest.mark.parametrize(("name", "args"), STATE_FILES, ids=[f[0] for f in STATE_FILES])
def test_a_directory_where_a_state_file_should_be_is_one_line(
    tmp_path: Path, name: str, args: list[str]
) -> None:
    state = tmp_path / "s"
    (state / name).mkdir(parents=True)
    text = _one_line_error(_start(state, args))
    assert f"{state / name}: Is a directory" in text, text
    assert "damaged" not in text and "repair" not in text, text
    assert (state / name).is_dir()


UNCREATABLE = [
    f for f in STATE_FILES if f[0] in ("dodwan.db", "bridges.db", "trace.jsonl", "joms.sqlite")
]


@pytest.mark.parametrize(("name", "args"), UNCREATABLE, ids=[f[0] for f in UNCREATABLE])
def test_a_state_file_that_cannot_be_created_is_one_line(
    tmp_path: Path, name: str, args: list[str]
) -> None:
    # A symbolic link into a directory that does not exist: the file cannot be created,
    # and the failure comes once the start-up is well under way (the store and core are
    # up), so the shutdown after it must not fail a second time.
    state = tmp_path / "s"
    state.mkdir()
    (state / name).symlink_to(tmp_path / "missing" / name)
    text = _one_line_error(_start(state, args))
    assert f"cannot open {state / name}" in text, text
    assert "damaged" not in text and "repair" not in text, text


# ---------------------------------------------------------------------- 6. settings


BAD_SETTINGS = [
    ("toml", "[node]\nannounce_period = nan\n", "announce_period"),
    ("args", ["--request-timeout", "inf"], "request_timeout"),
    ("args", ["--fragment-commit-delay", "nan"], "fragment_commit_delay"),
    ("args", ["--exec-timeout", "inf"], "exec_timeout"),
    ("args", ["--neighbour-timeout", "nan"], "neighbour_timeout"),
    ("toml", "[node.limits]\nmax_requests_per_second = nan\n", "max_requests_per_second"),
    ("toml", "[node.limits]\nmax_fragments = 0\n", "max_fragments"),
    ("toml", "[node.limits]\nmax_partial_bytes = -1\n", "max_partial_bytes"),
    ("toml", "[node.limits]\nmax_origin_share = 1.5\n", "max_origin_share"),
    ("toml", "[node.limits]\nmax_message_size = 10000\n", "max_message_size"),
    ("args", ["--socket-buffer", "1099511627776"], "socket_buffer"),
    ("args", ["--group", "10.1.2.3:{port}"], "group"),
]


@pytest.mark.parametrize(("how", "setting", "key"), BAD_SETTINGS, ids=[b[2] for b in BAD_SETTINGS])
def test_a_bad_setting_is_refused_at_start_naming_its_key(
    daemons, tmp_path: Path, how: str, setting, key: str
) -> None:
    if how == "toml":
        conf = tmp_path / "d.toml"
        conf.write_text(setting)
        args = ["--group", random_group(), "--config", str(conf)]
    else:
        args = [a.replace("{port}", str(random_port())) for a in setting]
        if "--group" not in args:
            args = ["--group", random_group(), *args]
    d = daemons("d", *args, wait=False)
    text = _exits_with_one_line(d)
    assert key in text, text


def test_stomp_on_port_0_reports_the_port_it_got(daemons) -> None:
    d = daemons("s", "--group", random_group(), "--stomp", "127.0.0.1:0")
    info = json.loads((d.state_dir / "admin.json").read_text())
    host, port = str(info["stomp"]).rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert f"127.0.0.1:{port}" in d.log.read_text()
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert s.recv(4096).startswith(b"CONNECTED\n")


# ---------------------------------------------------------------------- 7. leaks


def _raw_http(port: int, request: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_deeply_nested_json_is_a_clean_400(daemons) -> None:
    d = daemons("a", "--group", random_group())
    port = json.loads((d.state_dir / "admin.json").read_text())["port"]
    body = b"[" * 100_000
    status, text = _raw_http(
        port,
        b"POST /publish HTTP/1.1\r\nContent-Type: application/json\r\n"
        + admin_auth(d.state_dir)
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    assert status == 400, text
    assert "JSON" in json.loads(text)["error"]
    assert d.alive


@pytest.mark.timeout(240)
def test_publishing_exactly_the_documented_maximum_works(daemons) -> None:
    d = daemons("a", "--group", random_group(), "--fragment-cache", "0")
    biggest = int(d.status().get("max_payload", 64 * 1024 * 1024))
    assert biggest >= 60 * 1024 * 1024
    data = os.urandom(biggest)  # incompressible
    msg_id = d.client().publish_bytes(data)["id"]
    assert d.status()["cache"]["messages"] == 1 and msg_id in _ids(d.client())
    with pytest.raises(ClientError, match=f"largest publication is {biggest} bytes"):
        d.client().publish_bytes(data + b"x")
    del data


@pytest.mark.timeout(120)
def test_publish_of_a_file_too_large_shows_the_daemons_413(daemons, tmp_path: Path) -> None:
    d = daemons("a", "--group", random_group())
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(200 * 1024 * 1024)
    args = ["publish", "--state-dir", str(d.state_dir), "-a", "topic=big", "--file", str(big)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code != 0
    assert "reset" not in r.output.lower() and "Traceback" not in r.output
    assert "largest publication" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.timeout(180)
def test_disk_full_stomp_sends_are_confirmed_only_once_stored(
    small_disk: Path, tmp_path: Path
) -> None:
    """The gateway commits each run of SENDs once, before their receipts: when the disk
    fills, the run that could not be stored gets an ERROR and no receipt, and the daemon
    holds exactly the messages it confirmed (also after a restart)."""
    from joms.stomp.frame import Frame, FrameParser, encode

    port = free_port()  # outside the ephemeral range (see tests/brokers.py)
    a = DaemonProc(
        small_disk / "a",
        ["--group", random_group(), "--host-id", "A", "--stomp", f"127.0.0.1:{port}"],
    )
    a.log = tmp_path / "a.log"
    a.start()
    confirmed: set[str] = set()
    error: Frame | None = None
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        parser = FrameParser()
        pending: list[Frame] = []

        def next_frame() -> Frame:
            while not pending:
                data = sock.recv(65536)
                assert data, "the gateway closed the connection without an ERROR"
                pending.extend(parser.feed(data))
            return pending.pop(0)

        sock.sendall(encode(Frame("CONNECT", {"accept-version": "1.2", "host": "A"})))
        assert next_frame().command == "CONNECTED"
        for run in range(300):
            sends = [
                Frame("SEND", {"destination": "/topic/full", "receipt": f"r{run}.{k}"},
                      os.urandom(8192))
                for k in range(20)
            ]  # fmt: skip
            sock.sendall(b"".join(encode(f) for f in sends))
            got = 0
            while got < len(sends):
                f = next_frame()
                if f.command == "ERROR":
                    error = f
                    break
                assert f.command == "RECEIPT", f
                confirmed.add(f.headers["message-id"])
                got += 1
            if error is not None:
                break
        sock.close()
        assert confirmed and error is not None, (len(confirmed), error)
        assert "not published" in error.headers["message"], error.headers
        assert error.headers.get("joms-exception") == "ResourceAllocationException"

        def held() -> set[str]:
            return {
                e["descriptor"]["jms_message_id"]
                for e in a.client().get("/cache")
                if e["descriptor"].get("destination_id") == "full"
            }

        assert held() == confirmed
        a.kill()  # SIGKILL; its files, copied where there is room, as after a crash
        shutil.copytree(a.state_dir, tmp_path / "a2")
        (tmp_path / "a2" / "admin.json").unlink(missing_ok=True)
        a = DaemonProc(tmp_path / "a2", ["--group", random_group(), "--host-id", "A"])
        a.start()
        assert held() == confirmed
    finally:
        a.kill()
    assert "Traceback" not in (tmp_path / "a.log").read_text()
