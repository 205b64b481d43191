"""A clean stop (SIGTERM) of a daemon hosting the JOMS STOMP gateway with busy clients.

The gateway stops serving before the daemon closes its stores: clients get at most an ERROR
saying the server is stopping, never a storage failure, and the daemon logs no traceback and
no failed write.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from brokers import free_port as _free_port  # outside the ephemeral range
from stomp_raw import Frame, RawStomp, stomp_up
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")


def test_sigterm_with_a_busy_stomp_client_is_an_orderly_stop(daemons) -> None:
    """A producer sends with a receipt per frame; SIGTERM. The client sees its receipts,
    then at most an ERROR saying the server is stopping and the end of the connection —
    never a storage failure — and the daemon exits 0 without a traceback or a failed
    write (before the fix: `ResourceAllocationException … Cannot operate on a closed
    database` to the client, `cannot write to …/dodwan.db` and, at times, `JOMS service
    timer failed` with a traceback in the log)."""
    for cycle in range(3):
        port = _free_port()
        d = daemons(f"s{cycle}", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")
        wait_for(lambda port=port: stomp_up(port), what="STOMP gateway")
        # a queue consumer acknowledging as it goes keeps the service's ack batch busy
        worker = RawStomp(port, "worker")
        worker.send(
            "SUBSCRIBE", {"id": "q", "destination": "/queue/jobs", "ack": "client-individual"}
        )
        producer = RawStomp(port, "writer")
        frames: list[Frame] = []
        stop = threading.Event()

        def read(
            client: RawStomp = worker, stop: threading.Event = stop, frames: list[Frame] = frames
        ) -> None:
            while not stop.is_set():
                try:
                    f = client.recv(5)
                except (OSError, TimeoutError):
                    return
                if f[0] == "MESSAGE":
                    try:
                        client.send("ACK", {"id": f[1]["ack"]})
                    except OSError:
                        return
                else:
                    frames.append(f)

        def write(client: RawStomp = producer, stop: threading.Event = stop) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    client.send("SEND", {"destination": "/queue/jobs", "receipt": f"j{n}"}, f"j{n}")
                except OSError:
                    return
                time.sleep(0.001)

        threads = [threading.Thread(target=read, daemon=True),
                   threading.Thread(target=write, daemon=True)]  # fmt: skip
        for t in threads:
            t.start()
        # work under way: the producer's 20th receipt
        got = producer.until(lambda f: f[1].get("receipt-id") == "j20", 20)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        try:
            while True:
                got.append(producer.recv(10))
        except ConnectionError:
            pass  # the server closed the connection
        stop.set()
        rc = d.proc.wait(timeout=15)
        for t in threads:
            t.join(10)
        worker.close()
        producer.close()
        errors = [f for f in got + frames if f[0] == "ERROR"]
        for f in errors:
            assert "stopping" in f[1].get("message", ""), f
            assert "joms-exception" not in f[1], f
        assert rc == 0, rc
        log = d.log.read_text()
        assert "Traceback" not in log, log
        assert "cannot write" not in log, log
        assert "closed database" not in log, log
