"""kill -9 a daemon hosting the JOMS STOMP gateway under queue and durable-topic traffic.

Each cycle: a producer sends to ``/queue/jobs`` and ``/topic/news`` asking a receipt for every
frame; a consumer (client-individual acks on the queue, a durable subscription on the topic)
takes what comes; at a moment drawn from a seeded RNG the daemon is killed with SIGKILL and
restarted. At the end every message whose receipt came back has been consumed, and a message
seen twice was flagged ``redelivered:true`` every time after the first: the queue manager and
the durable subscription resumed after every kill, losing nothing and not silently duplicating;
after each kill every SQLite database in the state directory passes its integrity check.

Cycles: ``DODWAN_CRASH_CYCLES`` // 2 (5 by default, 25 with ``CI=true``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sqlite3
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from brokers import free_port as _free_port  # outside the ephemeral range
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

stomp = pytest.importorskip("stomp")
pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")


logging.getLogger("stomp.py").setLevel(logging.CRITICAL)  # broken pipes are the point here


def _cycles() -> int:
    env = os.environ.get("DODWAN_CRASH_CYCLES")
    if env:
        return max(1, int(env) // 2)
    return 25 if os.environ.get("CI", "").lower() == "true" else 5


class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, seen: dict[str, list[bool]], lock: threading.Lock) -> None:
        self.seen = seen
        self.lock = lock
        self.conn: Any = None

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.seen[frame.body].append(frame.headers.get("redelivered") == "true")
        if "ack" in frame.headers:
            # The daemon may be killed under us: the ack is lost then, as it may be.
            with contextlib.suppress(Exception):
                self.conn.ack(frame.headers["ack"])


class Producer(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, confirmed: set[str], lock: threading.Lock) -> None:
        self.confirmed = confirmed
        self.lock = lock

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.confirmed.add(frame.headers["receipt-id"])


def _connect(port: int, client_id: str, listener: Any) -> Any:
    c = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1)
    c.set_listener("l", listener)
    c.connect(wait=True, headers={"client-id": client_id})
    return c


def _subscribe(c: Any) -> None:
    c.subscribe("/queue/jobs", id="q", ack="client-individual")
    c.subscribe("/topic/news", id="t", headers={"durable-subscription-name": "keeper"})


def _close(c: Any) -> None:
    with contextlib.suppress(Exception):
        c.disconnect()


def _integrity(state_dir: Path) -> dict[str, str]:
    """``PRAGMA integrity_check`` of every SQLite database the daemon keeps."""
    out = {}
    for db in sorted([*state_dir.glob("*.db"), *state_dir.glob("*.sqlite")]):
        conn = sqlite3.connect(db)
        try:
            out[db.name] = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        finally:
            conn.close()
    return out


def test_queue_and_durable_topic_survive_kill_9(daemons) -> None:
    cycles = _cycles()
    rnd = random.Random(int(os.environ.get("DODWAN_CRASH_SEED", "8")))
    port = _free_port()
    d = daemons("s", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")
    lock = threading.Lock()
    seen: dict[str, list[bool]] = defaultdict(list)
    confirmed: set[str] = set()

    def up() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    wait_for(up, what="STOMP port")
    for cycle in range(cycles):
        consumer = Consumer(seen, lock)
        consumer.conn = _connect(port, "worker", consumer)
        _subscribe(consumer.conn)
        producer = _connect(port, "writer", Producer(confirmed, lock))
        stop = threading.Event()

        def produce(cycle: int = cycle, producer: Any = producer, stop: threading.Event = stop):
            i = 0
            while not stop.is_set():
                for dest in ("queue/jobs", "topic/news"):
                    body = f"{dest[0]}-{cycle}-{i}"
                    try:
                        producer.send(f"/{dest}", body, headers={"receipt": body})
                    except Exception:
                        return  # killed
                i += 1
                stop.wait(0.01)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        stop.wait(rnd.uniform(0.3, 1.2))  # the random moment of the fault
        assert d.kill(signal.SIGKILL) == -signal.SIGKILL
        stop.set()
        t.join(10)
        _close(producer)
        _close(consumer.conn)
        checked = _integrity(d.state_dir)
        assert "dodwan.db" in checked, checked
        assert set(checked.values()) == {"ok"}, f"kill {cycle}: {checked}"
        d.start()
        wait_for(up, what=f"STOMP port after kill {cycle}")

    consumer = Consumer(seen, lock)
    consumer.conn = _connect(port, "worker", consumer)
    _subscribe(consumer.conn)
    with lock:
        expected = set(confirmed)
    assert len(expected) >= 10 * cycles

    def missing() -> set[str]:
        with lock:  # the listener thread adds to ``seen`` meanwhile
            return expected - set(seen)

    wait_for(
        lambda: not missing(),
        # a message held for a consumer that died with the daemon is free at the restart;
        # the bound is still beyond the 30 s receiver lease
        timeout=45,
        what=lambda: (
            f"every confirmed message consumed ({len(expected)}); "
            f"missing e.g. {sorted(missing())[:20]}"
        ),
    )
    _close(consumer.conn)
    with lock:
        for body, flags in seen.items():
            assert all(flags[1:]), f"{body} delivered again without redelivered: {flags}"
    twice = {b: f for b, f in seen.items() if len(f) > 1}
    print(
        f"stomp crash suite: {cycles} kills, {len(expected)} confirmed, "
        f"{len(seen)} consumed, {len(twice)} redelivered (flagged)"
    )
