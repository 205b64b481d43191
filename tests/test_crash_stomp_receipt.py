"""Stopping a daemon that hosts the JOMS STOMP gateway right after a RECEIPT.

A queue ACK (or a COMMIT of a transaction acknowledging queue messages) whose RECEIPT came
back is never undone by a stop, however soon the stop follows: SIGKILL or SIGTERM sent the
moment the RECEIPT arrives, the acknowledged messages are not delivered again after the
restart.
"""

from __future__ import annotations

import signal

import pytest
from brokers import free_port as _free_port  # outside the ephemeral range
from stomp_raw import RawStomp, restart, stomp_up
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")


@pytest.mark.parametrize("mode", ["ack", "tx"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_a_confirmed_queue_ack_survives_a_stop_right_after_its_receipt(
    daemons, sig: signal.Signals, mode: str
) -> None:
    """ACK (receipt on the last one) or BEGIN/ACK/COMMIT (receipt on COMMIT); the daemon
    gets the signal the moment the RECEIPT arrives; after the restart none of the
    acknowledged messages comes again (before the fix: most of them did, flagged
    redelivered — the ack was still in the service's 20 ms ack batch)."""
    port = _free_port()
    d = daemons("s", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")
    wait_for(lambda: stomp_up(port), what="STOMP gateway")
    again: list[tuple[str, str | None]] = []
    acked_total = 0
    for it in range(3):
        producer = RawStomp(port, "writer")
        bodies = [f"it{it}-{k}" for k in range(5)]
        for k, body in enumerate(bodies):
            producer.send("SEND", {"destination": "/queue/jobs", "receipt": f"r{k}"}, body)
        producer.until(lambda f: f[1].get("receipt-id") == "r4")
        producer.close()

        worker = RawStomp(port, "worker")
        worker.send(
            "SUBSCRIBE", {"id": "q", "destination": "/queue/jobs", "ack": "client-individual"}
        )
        last = bodies[-1]
        frames = worker.until(lambda f, last=last: f[0] == "MESSAGE" and f[2].decode() == last)
        msgs = [f for f in frames if f[0] == "MESSAGE"]
        assert sorted(f[2].decode() for f in msgs) == bodies
        if mode == "tx":
            worker.send("BEGIN", {"transaction": "t"})
            for f in msgs:
                worker.send("ACK", {"id": f[1]["ack"], "transaction": "t"})
            worker.send("COMMIT", {"transaction": "t", "receipt": "done"})
        else:
            for i, f in enumerate(msgs):
                extra = {"receipt": "done"} if i == len(msgs) - 1 else {}
                worker.send("ACK", {"id": f[1]["ack"], **extra})
        answer = worker.until(lambda f: f[0] in ("RECEIPT", "ERROR"))[-1]
        assert d.proc is not None
        d.proc.send_signal(sig)  # the moment the RECEIPT is read
        assert answer[0] == "RECEIPT", answer
        rc = d.proc.wait(timeout=15)
        assert rc == (-sig if sig == signal.SIGKILL else 0), rc
        worker.close()
        acked_total += len(bodies)

        restart(d, port)
        # a marker sent after the restart comes after anything still waiting in the queue
        producer = RawStomp(port, "writer")
        producer.send("SEND", {"destination": "/queue/jobs", "receipt": "m"}, f"marker-{it}")
        producer.until(lambda f: f[1].get("receipt-id") == "m")
        producer.close()
        drain = RawStomp(port, "drain")
        drain.send("SUBSCRIBE", {"id": "q", "destination": "/queue/jobs", "ack": "auto"})
        marker = f"marker-{it}".encode()
        frames = drain.until(lambda f, marker=marker: f[0] == "MESSAGE" and f[2] == marker)
        drain.close()
        again += [
            (f[2].decode(), f[1].get("redelivered"))
            for f in frames
            if f[0] == "MESSAGE" and f[2].decode() in bodies
        ]
    assert not again, (
        f"{len(again)} of {acked_total} messages acknowledged with a RECEIPT were delivered "
        f"again after a {sig.name}: {again}"
    )
