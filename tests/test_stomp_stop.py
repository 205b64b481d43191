"""A clean stop (SIGTERM) of a daemon hosting the JOMS STOMP gateway with busy clients.

The gateway stops serving before the daemon closes its stores: clients get at most an ERROR
saying the server is stopping, never a storage failure, and the daemon logs no traceback and
no failed write.
"""

from __future__ import annotations

import contextlib
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


def test_a_connection_accepted_as_the_gateway_stops_is_closed_unserved() -> None:
    """asyncio makes a connection's protocol, then calls its ``connection_made`` one loop
    step later; a stop landing in between (the daemon closes the gateway and its stores with
    no await between them) used to leave that connection unknown to the gateway's close and
    served afterwards: CONNECTED, then a RECEIPT for a SEND, from a stopped server."""
    import asyncio
    import socket

    from joms_support import LoopThread, start_hosts

    from joms.stomp.frame import Frame as StompFrame
    from joms.stomp.frame import FrameParser, encode

    lt = LoopThread()
    (h,) = start_hosts(lt, 1, prefix="stopaccept")
    gw = h.server.gateway
    try:

        async def listen() -> tuple[str, int]:
            def factory():  # type: ignore[no-untyped-def]
                conn = gw.protocol()  # the gateway still open
                gw.close()  # the stop, before connection_made
                return conn

            srv = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
            return srv.sockets[0].getsockname()[:2]  # type: ignore[no-any-return]

        with socket.create_connection(lt.call(listen()), timeout=5) as s:
            parser, got = FrameParser(), []
            # the gateway may close it before, while or after our frames arrive (unread)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(
                    encode(StompFrame("CONNECT", {"accept-version": "1.2", "host": "h"}))
                    + encode(StompFrame("SEND", {"destination": "/queue/q", "receipt": "r"}, b"x"))
                )
                while data := s.recv(65536):  # until the gateway closes it
                    got += parser.feed(data)
        assert [f.command for f in got] == [], got
    finally:
        lt.call(h.stop())
        lt.close()
