"""Local interfaces: the admin API and STOMP listen on 127.0.0.1/::1 unless told otherwise,
and then only with a bearer token (admin) or a login (STOMP).

127.0.0.2 stands for "another address": it is not a default address, so it takes the
explicit path, yet it never leaves the machine.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.cli import cli
from dodwan.daemon.client import AdminClient, ClientError


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _refused(tmp_path: Path, *args: str) -> str:
    state = tmp_path / f"x{len(list(tmp_path.iterdir()))}"
    d = DaemonProc(state, ["--group", random_group(), *args])
    d.start(wait=False)
    assert d.proc is not None
    assert d.proc.wait(timeout=20) != 0
    text = d.log.read_text().strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert not (state / "admin.json").exists()
    return text


def test_admin_elsewhere_than_localhost_needs_allow_remote(tmp_path: Path) -> None:
    for addr in ("127.0.0.2:0", "0.0.0.0:0"):
        r = CliRunner().invoke(cli, ["daemon", "--state-dir", str(tmp_path), "--admin", addr])
        assert r.exit_code != 0 and "Traceback" not in r.output
        assert "--allow-remote" in r.output and len(r.output.splitlines()) == 1


def test_remote_admin_requires_the_token_of_the_state_dir(daemons) -> None:
    a = daemons("a", "--group", random_group(), "--admin", "127.0.0.2:0", "--allow-remote")
    token_file = a.state_dir / "admin.token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32
    info = json.loads((a.state_dir / "admin.json").read_text())
    assert info["host"] == "127.0.0.2"

    def raw(headers: dict[str, str]) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(info["host"], info["port"], timeout=10)
        conn.request("GET", "/status", headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())

    status, body = raw({})
    assert status == 401 and "token" in body["error"]
    assert raw({"Authorization": "Bearer " + "x" * len(token)})[0] == 401
    assert raw({"Authorization": token})[0] == 401
    status, body = raw({"Authorization": f"Bearer {token}"})
    assert status == 200 and body["pid"] == info["pid"]
    # The CLI's client reads the token from the state directory.
    assert a.client().get("/status")["host_id"]
    with pytest.raises(ClientError, match="token"):
        AdminClient(info["host"], info["port"]).get("/status")
    r = CliRunner().invoke(cli, ["status", "--json", "--state-dir", str(a.state_dir)])
    assert r.exit_code == 0 and json.loads(r.output)["pid"] == info["pid"]
    # The token survives a restart (remote scripts keep working).
    a.kill()
    a.start()
    assert token_file.read_text().strip() == token


def test_local_admin_needs_no_token(daemons) -> None:
    a = daemons("a", "--group", random_group())
    assert not (a.state_dir / "admin.token").exists()
    info = json.loads((a.state_dir / "admin.json").read_text())
    assert info["host"] == "127.0.0.1"
    conn = http.client.HTTPConnection(info["host"], info["port"], timeout=10)
    conn.request("GET", "/status")
    assert conn.getresponse().status == 200


def _stomp_connect(port: int, host: str, creds: str = "") -> bytes:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"CONNECT\naccept-version:1.2\nhost:localhost\n{creds}\n\x00".encode())
        return s.recv(4096)


def test_stomp_elsewhere_needs_allow_remote_and_a_login(tmp_path: Path) -> None:
    pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")
    port = _free_port("127.0.0.2")
    text = _refused(tmp_path, "--stomp", f"127.0.0.2:{port}")
    assert "--allow-remote" in text
    text = _refused(tmp_path, "--stomp", f"127.0.0.2:{port}", "--allow-remote")
    assert "login" in text
    text = _refused(tmp_path, "--stomp", "127.0.0.1:0", "--stomp-login", "u")
    assert "go together" in text


def test_remote_stomp_with_a_login_accepts_only_it(daemons, tmp_path: Path) -> None:
    pytest.importorskip("joms.stomp.server", reason="the JOMS STOMP gateway is not available")
    port = _free_port("127.0.0.2")
    passfile = tmp_path / "stomp.pass"
    passfile.write_text("s3cret-pass\n")
    passfile.chmod(0o600)
    d = daemons("s", "--group", random_group(), "--stomp", f"127.0.0.2:{port}",
                "--allow-remote", "--stomp-login", "alice",
                "--stomp-passcode-file", str(passfile))  # fmt: skip
    good = wait_for(
        lambda: _stomp_connect(port, "127.0.0.2", "login:alice\npasscode:s3cret-pass\n"),
        what="STOMP CONNECTED",
    )
    assert good.startswith(b"CONNECTED\n")
    assert _stomp_connect(port, "127.0.0.2").startswith(b"ERROR\n")
    assert _stomp_connect(port, "127.0.0.2", "login:alice\npasscode:wrong\n").startswith(b"ERROR\n")
    # The admin API stayed local: no token was needed nor made.
    assert not (d.state_dir / "admin.token").exists()
    assert d.alive
