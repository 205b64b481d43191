"""Real ``dodwan daemon`` processes on loopback multicast: transfer, crash safety, hostile input."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
from test_daemon_helpers import DaemonProc, group_alive, random_group, random_port, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.core import Node, NodeConfig

FAST = ["--announce-period", "0.5"]


def _files(d: Path) -> list[Path]:
    return sorted(
        p for p in d.iterdir() if not p.name.endswith(".json") and not p.name.startswith(".")
    )


def test_three_daemons_move_a_1mb_file_byte_identical(daemons, tmp_path: Path) -> None:
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", *FAST)
    b = daemons("b", "--group", group, "--host-id", "b", *FAST)
    c = daemons("c", "--group", group, "--host-id", "c", *FAST)
    out = tmp_path / "out"
    key = c.client().post(
        "/subscribe",
        {"patterns": [{"topic": "files\\..*"}], "sink": {"kind": "dir", "target": str(out)}},
    )["key"]
    wait_for(lambda: {"b", "c"} <= set(a.status()["neighbours"]), what="a hears b and c")
    data = random.Random(7).randbytes(1 << 20)

    mid = a.client().post(
        "/publish",
        {
            "attributes": {"topic": "files.big"},
            "payload_b64": base64.b64encode(data).decode(),
            "ttl": 600,
        },
    )["id"]
    target = out / mid
    wait_for(lambda: (out / f"{mid}.json").exists(), timeout=30, what="delivery in c's --dir")
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
    subs = c.client().get("/subscriptions")
    assert [s["key"] for s in subs] == [key]
    # b subscribed to nothing: if it took the message, only to carry it for c (horizon 2).
    assert all(m["reason"] == "carried for c" for m in b.client().get("/cache"))
    assert a.alive and b.alive and c.alive


def _exec_sink(log: Path) -> dict[str, str]:
    return {"kind": "exec", "target": f'echo "$DODWAN_ID $DODWAN_ATTR_TOPIC" >> {log}'}


def test_kill_9_keeps_cache_and_subscriptions_and_never_redelivers(daemons, tmp_path: Path) -> None:
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", *FAST)
    # Published, then killed at once: the message must still be cached after restart.
    mid = a.client().post("/publish", {"attributes": {"topic": "t1"}, "text": "first", "ttl": 600})[
        "id"
    ]
    assert a.kill(signal.SIGKILL) == -signal.SIGKILL
    a.start()
    assert [m["id"] for m in a.client().get("/cache")] == [mid]

    log = tmp_path / "deliveries.log"
    b = daemons("b", "--group", group, "--host-id", "b", *FAST)
    b.client().post(
        "/subscribe", {"patterns": [{"topic": "t.*"}], "sink": _exec_sink(log), "key": "mine"}
    )
    wait_for(lambda: log.exists() and mid in log.read_text(), what="first delivery via --exec")
    # The command ran; killed before the daemon recorded that, b would run it again after
    # the restart (at-least-once, by design). Kill it once the delivery is recorded.
    wait_for(lambda: b.status()["counters"].get("daemon_sink_deliveries_finished", 0) >= 1,
             what="the exec delivery recorded as finished")  # fmt: skip
    b.kill(signal.SIGKILL)
    b.start()
    assert [s["key"] for s in b.client().get("/subscriptions")] == ["mine"]
    assert [m["id"] for m in b.client().get("/cache")] == [mid]
    # A second message proves the restarted b is back in contact and served by a.
    mid2 = a.client().post(
        "/publish", {"attributes": {"topic": "t2"}, "text": "second", "ttl": 600}
    )["id"]
    wait_for(lambda: mid2 in log.read_text(), what="second delivery after restart")
    wait_for(lambda: b.status()["counters"].get("announcements_sent", 0) >= 3, what="a few rounds")
    lines = log.read_text().split("\n")
    assert sorted(x for x in lines if x) == sorted([f"{mid} t1", f"{mid2} t2"])


def _send_to_group(group: str, datagrams: list[bytes]) -> None:
    host, port = group.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        for d in datagrams:
            s.sendto(d, (host, int(port)))
            time.sleep(0.0005)  # pace the burst a little: we count drops, not overflows


def _real_datagrams() -> list[bytes]:
    node = Node(NodeConfig(host_id="forger", max_datagram=1400), rng=random.Random(3))
    t = time.time()  # the daemon refuses deadlines past now + limits.max_ttl
    node.handle_timer(t)
    node.subscribe({"topic": ".*"}, now=t)
    node.publish({"topic": "x"}, random.Random(4).randbytes(5000), deadline=t + 3600, now=t)
    node.handle_timer(t + 10.0)
    return [d for d, _ in node.datagrams_to_send(t + 10.0)]


def test_garbage_and_truncated_datagrams_are_counted_and_survived(daemons, tmp_path: Path) -> None:
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", *FAST)
    b = daemons("b", "--group", group, "--host-id", "b", *FAST)
    rnd = random.Random(11)
    real = _real_datagrams()
    assert real
    garbage = [rnd.randbytes(rnd.randrange(0, 1500)) for _ in range(150)]
    truncated = [d[: rnd.randrange(0, len(d))] for d in real for _ in range(10)]
    before = b.status()["counters"].get("datagrams_dropped", 0)
    _send_to_group(group, garbage + truncated)
    wait_for(
        lambda: b.status()["counters"].get("datagrams_dropped", 0) - before >= 100,
        what="drops counted",
    )
    counters = b.status()["counters"]
    assert counters.get("internal_errors", 0) == 0
    assert any(k.startswith("dropped_") for k in counters)
    # Still serving: a subscription on b gets a's next message.
    out = tmp_path / "out"
    b.client().post(
        "/subscribe", {"patterns": [{"k": "v"}], "sink": {"kind": "dir", "target": str(out)}}
    )
    mid = a.client().post("/publish", {"attributes": {"k": "v"}, "text": "still here", "ttl": 60})[
        "id"
    ]
    wait_for(lambda: (out / f"{mid}.json").exists(), what="delivery after garbage")
    assert (out / mid).read_text() == "still here"
    metrics = a.client().get("/metrics")
    assert 'dodwan_events_total{name="datagrams_dropped"}' in metrics
    assert a.alive and b.alive


def test_follow_streams_deliveries_and_ends_with_the_client(daemons) -> None:
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", *FAST)
    stream = a.client().stream("/follow", {"patterns": [{"topic": "live"}], "key": "watch"})
    first = next(stream)
    assert first == {"subscribed": "watch"}
    mid = a.client().post("/publish", {"attributes": {"topic": "live"}, "text": "hi", "ttl": 60})[
        "id"
    ]
    item = next(stream)
    assert item["descriptor"]["id"] == mid and item["text"] == "hi"
    assert item["subscription"] == "watch"
    stream.close()  # type: ignore[attr-defined]
    import gc

    gc.collect()
    wait_for(lambda: a.client().get("/subscriptions") == [], what="follow subscription removed")


def test_second_daemon_on_the_same_state_dir_is_refused(daemons, tmp_path: Path) -> None:
    group = random_group()
    a = daemons("a", "--group", group, *FAST)
    dup = DaemonProc(a.state_dir, ["--group", group])
    dup.start(wait=False)
    assert dup.proc is not None
    rc = dup.proc.wait(timeout=20)
    assert rc == 1
    text = dup.log.read_text()
    assert "another daemon is running" in text and "Traceback" not in text
    assert a.alive


def test_sigterm_is_a_clean_shutdown(daemons) -> None:
    a = daemons("a", "--group", random_group(), *FAST)
    host_id = a.status()["host_id"]
    assert a.kill(signal.SIGTERM) == 0
    assert not (a.state_dir / "admin.json").exists()
    a.start()
    assert a.status()["host_id"] == host_id  # generated once, kept in SQLite
    assert os.path.exists(a.state_dir / "dodwan.db")


def test_a_failed_command_is_counted_as_the_documented_sink_errors(daemons) -> None:
    a = daemons("a", "--group", random_group(), *FAST)
    c = a.client()
    c.post("/subscribe", {"patterns": [{"t": "x"}], "sink": {"kind": "exec", "target": "exit 3"}})
    c.post("/publish", {"attributes": {"t": "x"}, "text": "one", "ttl": 600})
    counters = wait_for(
        lambda: (n := a.status()["counters"]).get("daemon_sink_deliveries_finished") and n,
        what="the failed command finished",
    )
    assert counters.get("sink_errors") == 1
    assert not [k for k in counters if k.startswith(("sink_sink_", "daemon_daemon_"))]
    metrics = c.get("/metrics")
    assert 'dodwan_events_total{name="sink_errors"} 1' in metrics
    assert "sink_sink_" not in metrics


def test_sigterm_stops_running_commands_which_are_redelivered_at_restart(
    daemons, tmp_path: Path
) -> None:
    """A clean stop leaves no command of an exec sink behind (it would outlive the daemon
    and run beside its own redelivery); the stopped delivery is redone at the next start."""
    a = daemons("a", "--group", random_group(), *FAST)
    log = tmp_path / "exec.log"
    target = f'echo "$$ ${{DODWAN_REDELIVERED:-0}}" >> {log}; sleep 60; echo done >> {log}'
    a.client().post("/subscribe", {"patterns": [{"t": "x"}], "sink": {"kind": "exec",
                                                                      "target": target}})  # fmt: skip
    a.client().post("/publish", {"attributes": {"t": "x"}, "text": "one", "ttl": 600})
    wait_for(lambda: log.exists() and log.read_text().count("\n") == 1, what="the command runs")
    first = int(log.read_text().split()[0])
    wait_for(lambda: group_alive(first), what="its process group")
    assert a.kill(signal.SIGTERM) == 0
    wait_for(lambda: not group_alive(first), 10, what=lambda: f"no orphan of group {first}")

    a.start()
    wait_for(lambda: log.read_text().count("\n") == 2, what="the delivery redone")
    lines = log.read_text().splitlines()
    second = int(lines[1].split()[0])
    assert lines[0].split()[1] == "0" and lines[1].split()[1] == "1"
    assert second != first and a.status()["counters"]["daemon_redeliveries"] == 1
    assert a.kill(signal.SIGTERM) == 0
    wait_for(lambda: not group_alive(second), 10, what=lambda: f"no orphan of group {second}")
    assert "done" not in log.read_text()


@pytest.mark.parametrize(
    "bad", [["--group", "nonsense"], ["--interface", "nosuchif0"], ["--admin", "127.0.0.1:99999"]]
)
def test_bad_settings_exit_with_one_line(tmp_path: Path, bad: list[str]) -> None:
    d = DaemonProc(tmp_path / "x", bad)
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(timeout=20) != 0
    text = d.log.read_text().strip()
    assert "Traceback" not in text
    assert text.startswith("Error: ") and len(text.splitlines()) == 1


def test_an_ipv6_group_on_an_interface_without_multicast_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """An IPv6 group on ``lo`` (no MULTICAST flag: every send fails, ENETUNREACH) started,
    said it was up and never sent a datagram; only ``udp_send_errors`` grew. It is refused
    at start now, in one line naming the interface and what to use instead."""
    flags = int(Path("/sys/class/net/lo/flags").read_text(), 16)
    if flags & 0x1000:  # IFF_MULTICAST
        pytest.skip("this machine's lo carries multicast: the refusal cannot be seen here")
    d = DaemonProc(tmp_path / "x", ["--group", f"[ff02::4242]:{random_port()}"])
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(timeout=20) != 0, "the daemon started on a group it cannot reach"
    text = d.log.read_text().strip()
    assert "Traceback" not in text
    assert text.startswith("Error: ") and len(text.splitlines()) == 1, text
    assert "[ff02::4242]" in text and "interface lo" in text and "MULTICAST" in text, text


def test_admin_api_errors_and_raw_publish(daemons) -> None:
    import http.client
    import json

    a = daemons("a", "--group", random_group(), *FAST)
    c = a.client()

    def raw(
        method: str, path: str, body: bytes = b"", ctype: str = "application/json"
    ) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(c.host, c.port, timeout=10)
        auth = {"Authorization": f"Bearer {c.token}"}
        conn.request(method, path, body=body, headers={"Content-Type": ctype, **auth})
        r = conn.getresponse()
        return r.status, json.loads(r.read())

    assert raw("GET", "/nowhere")[0] == 404
    assert raw("POST", "/status")[0] == 405
    status, err = raw("POST", "/publish", b"{not json")
    assert status == 400 and "not JSON" in err["error"]
    assert raw("POST", "/publish", b"[1, 2]")[0] == 400
    assert raw("POST", "/publish", b'{"attributes": {"a": 1}, "text": "x"}')[0] == 400
    assert (
        raw(
            "POST",
            "/subscribe",
            b'{"patterns": [{"a": "("}], "sink": {"kind": "dir", "target": "/tmp/x"}}',
        )[0]
        == 400
    )
    assert (
        raw(
            "POST",
            "/subscribe",
            b'{"patterns": [{"a": "b"}], "sink": {"kind": "dir", "target": "rel"}}',
        )[0]
        == 400
    )
    assert raw("DELETE", "/subscriptions/none")[0] == 404
    assert raw("GET", "/cache/none")[0] == 404
    payload = bytes(range(256)) * 100
    mid = c.publish_bytes(payload, attributes={"k": "v"}, ttl=60)["id"]
    shown = c.get(f"/cache/{mid}?payload=1")
    assert base64.b64decode(shown["payload_b64"]) == payload
    assert shown["descriptor"]["k"] == "v" and shown["reason"] == "published here"
    assert a.alive


@pytest.mark.parametrize(
    ("path", "body", "headers", "needle"),
    [
        ("/subscribe", {"patterns": {"a": "b"}, "key": 123}, {}, "key must be a string"),
        ("/follow", {"patterns": {"a": "b"}, "key": ["k"]}, {}, "key must be a string"),
        ("/subscribe", {"patterns": {"a": "b"}, "key": "joms:x"}, {}, "reserved"),
        ("/publish", b"x", {"X-Dodwan-Publish": "{not json"}, "X-Dodwan-Publish header is not"),
        ("/publish", b"x", {"X-Dodwan-Publish": "[1]"}, "X-Dodwan-Publish header must be"),
        ("/publish", b"{oops", {}, "request body is not JSON"),
    ],
)
def test_admin_api_errors_say_what_is_wrong(
    daemons, tmp_path: Path, path: str, body: object, headers: dict[str, str], needle: str
) -> None:
    import http.client

    a = daemons("a", "--group", random_group(), *FAST)
    c = a.client()
    if isinstance(body, dict):
        if path == "/subscribe":
            body["sink"] = {"kind": "dir", "target": str(tmp_path / "out")}
        data, ctype = json.dumps(body).encode(), "application/json"
    else:
        data = body
        ctype = "application/octet-stream" if headers else "application/json"
    conn = http.client.HTTPConnection(c.host, c.port, timeout=10)
    auth = {"Authorization": f"Bearer {c.token}"}
    conn.request("POST", path, body=data, headers={"Content-Type": ctype, **headers, **auth})
    r = conn.getresponse()
    err = json.loads(r.read())["error"]
    assert r.status == 400 and needle in err, err
    assert c.get("/subscriptions") == [] and c.get("/cache") == []


def test_bitrate_paces_what_a_daemon_sends(daemons, tmp_path: Path) -> None:
    group = random_group()
    bitrate = 400_000  # bits/s: 60 KB of fragments need > 1 s
    a = daemons("a", "--group", group, "--host-id", "a", "--bitrate", str(bitrate),
                "--burst", "4000", *FAST)  # fmt: skip
    b = daemons("b", "--group", group, "--host-id", "b", *FAST)
    out = tmp_path / "out"
    b.client().post(
        "/subscribe", {"patterns": [{"k": "slow"}], "sink": {"kind": "dir", "target": str(out)}}
    )
    wait_for(lambda: "b" in a.client().get("/profile")["known"], what="a knows b's profile")
    payload = random.Random(9).randbytes(60_000)
    start = time.monotonic()
    mid = a.client().publish_bytes(payload, attributes={"k": "slow"}, ttl=60)["id"]
    wait_for(lambda: (out / f"{mid}.json").exists(), timeout=30, what="paced delivery")
    elapsed = time.monotonic() - start
    assert (out / mid).read_bytes() == payload
    assert elapsed >= 60_000 * 8 / bitrate * 0.8
    assert a.status()["counters"]["pacer_sent"] > 40


def test_trace_records_go_to_a_jsonl_file(daemons) -> None:
    import json

    a = daemons("a", "--group", random_group(), "--trace", *FAST)
    mid = a.client().post("/publish", {"attributes": {"k": "v"}, "text": "traced", "ttl": 60})["id"]
    wait_for(lambda: a.status()["counters"].get("announcements_sent", 0) >= 1, what="announce")
    assert a.kill(signal.SIGTERM) == 0  # a clean stop flushes the file
    records = [json.loads(x) for x in (a.state_dir / "trace.jsonl").read_text().splitlines()]
    created = [r for r in records if r["kind"] == "message_created"]
    assert [r["msg_id"] for r in created] == [mid] and created[0]["size"] == len("traced")
    assert any(r["kind"] == "datagram_sent" for r in records)


def test_sigterm_with_an_open_follow_stream_cleans_up(daemons) -> None:
    a = daemons("a", "--group", random_group(), *FAST)
    stream = a.client().stream("/follow", {"patterns": [{"x": "y"}], "key": "open"})
    assert next(stream) == {"subscribed": "open"}
    assert a.kill(signal.SIGTERM) == 0
    assert list(stream) == []  # the daemon ended the stream
    log = a.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log
    a.start()
    assert a.client().get("/subscriptions") == []


def test_kill_9_in_the_middle_of_a_transfer_resumes_and_delivers_once(
    daemons, tmp_path: Path
) -> None:
    group = random_group()
    # a sends at 4 Mbit/s: 400 KB take about a second, time to kill b half-way.
    a = daemons("a", "--group", group, "--host-id", "a", "--bitrate", "4000000", *FAST)
    b = daemons("b", "--group", group, "--host-id", "b", *FAST)
    log = tmp_path / "deliveries.log"
    b.client().post("/subscribe", {"patterns": [{"k": "big"}], "sink": _exec_sink(log)})
    wait_for(lambda: "b" in a.client().get("/profile")["known"], what="a knows b's profile")
    payload = random.Random(12).randbytes(400_000)
    mid = a.client().publish_bytes(payload, attributes={"k": "big", "topic": "x"}, ttl=600)["id"]
    wait_for(
        lambda: b.status()["counters"].get("fragments_stored", 0) >= 30, what="transfer under way"
    )
    assert b.kill(signal.SIGKILL) == -signal.SIGKILL
    b.start()
    cached = b.client().get("/cache")
    assert all(not m["complete"] for m in cached)  # only a partial set (or nothing) survived
    wait_for(lambda: log.exists() and mid in log.read_text(), timeout=40, what="resumed delivery")
    wait_for(lambda: b.status()["counters"].get("announcements_sent", 0) >= 3, what="a few rounds")
    assert log.read_text().splitlines() == [f"{mid} x"]
    out = b.client().get(f"/cache/{mid}?payload=1")
    assert base64.b64decode(out["payload_b64"]) == payload


def test_memory_probe_samples_the_daemon_tables(
    daemons, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "memtrace"
    monkeypatch.setenv("DODWAN_MEMTRACE", str(trace))
    monkeypatch.setenv("DODWAN_MEMTRACE_PERIOD", "0.2")
    a = daemons("a", "--group", random_group(), "--host-id", "a")
    a.client().publish_bytes(b"x" * 5000, attributes={"topic": "t"}, ttl=60)
    samples_file = trace / "mem.jsonl"
    lines = wait_for(
        lambda: (
            samples_file.exists()
            and len(samples_file.read_text().splitlines()) >= 3
            and samples_file.read_text().splitlines()
        ),
        20,
        what="three memory samples",
    )
    last = json.loads(lines[-1])
    assert last["rss_kb"] > 0 and last["gc_objects"] > 0
    assert last["store"]["frag_messages"] == 1 and last["store"]["unwritten"] == 0
    assert last["node"]["_cache"] == 1
    # the daemons fixture then checks the log holds no traceback (a failing probe logs one)


def test_a_neighbour_restarted_within_the_timeout_is_noticed_and_logged(daemons) -> None:
    """A daemon restarted faster than its neighbours' timeout was the same neighbour to
    them, as if it had never left (what they offered it while it was down counted as
    offered). Its announcements starting over now tell them, and the log says so."""
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "a", "--announce-period", "0.5",
                "--neighbour-timeout", "600", "--log-level", "info")  # fmt: skip
    b = daemons("b", "--group", group, "--host-id", "b", "--announce-period", "0.5")
    wait_for(lambda: b.status()["counters"].get("announcements_sent", 0) >= 4, what="b runs")
    assert b.kill(signal.SIGTERM) == 0
    b.start()
    wait_for(lambda: a.status()["counters"].get("neighbours_restarted") == 1, what="restart")
    counters = a.status()["counters"]
    assert counters["neighbours_found"] == 1 and "neighbours_lost" not in counters
    assert "b" in a.status()["neighbours"]
    wait_for(lambda: "neighbour b restarted" in a.log.read_text(), what="the log line")
