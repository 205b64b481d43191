"""The daemon's ``--stomp`` hook: it hosts the JOMS STOMP gateway when joms provides it."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from brokers import free_port as _free_port  # outside the ephemeral range
from click.testing import CliRunner
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for

from dodwan.cli import cli


def test_stomp_gateway_answers_connect(daemons) -> None:
    pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")
    port = _free_port()
    d = daemons("s", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")

    def connected() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            return s.recv(4096)

    reply = wait_for(connected, what="STOMP CONNECTED")
    assert reply.startswith(b"CONNECTED\n")

    # A topic round trip through the daemon: SEND -> DoDWAN publish -> joms: delivery -> MESSAGE.
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        s.sendall(b"SUBSCRIBE\ndestination:/topic/news\nid:1\nack:auto\n\n\x00")
        s.sendall(
            b"SEND\ndestination:/topic/news\ncontent-type:text/plain\nreceipt:r1\n\nhello daemon\x00"
        )
        data = b""
        while b"MESSAGE\n" not in data or not data.rstrip(b"\n").endswith(b"\x00"):
            chunk = s.recv(65536)
            assert chunk, f"gateway closed: {data!r}"
            data += chunk
    message = data[data.index(b"MESSAGE\n") :]
    assert b"destination:/topic/news" in message and b"hello daemon" in message
    subs = d.client().get("/subscriptions")
    assert any(x["key"].startswith("joms:") and x["sink"]["kind"] == "service" for x in subs)
    assert d.alive


def test_stomp_without_the_gateway_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "joms.stomp.server", None)  # makes the import fail
    r = CliRunner().invoke(
        cli,
        ["daemon", "--state-dir", str(tmp_path), "--group", random_group(),
         "--stomp", "127.0.0.1:0"],
    )  # fmt: skip
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert "--stomp needs the JOMS STOMP gateway" in r.output


def test_stomp_bad_address_is_one_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        ["daemon", "--state-dir", str(tmp_path), "--group", random_group(), "--stomp", "nope"],
    )
    assert r.exit_code == 1 and "--stomp" in r.output and "Traceback" not in r.output
