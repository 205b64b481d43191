"""Local interfaces: the admin API and STOMP listen on 127.0.0.1/::1 unless told otherwise,
and then only with a bearer token (admin) or a login (STOMP).

127.0.0.2 stands for "another address": it is not a default address, so it takes the
explicit path, yet it never leaves the machine.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _raw(
    info: dict[str, Any],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
    host: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """One request as a browser (or anything) may shape it: ``Host`` exactly as given."""
    default_host = f"{info['host']}:{info['port']}"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or default_host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    with socket.create_connection((info["host"], info["port"]), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, payload = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def _bearer(state_dir: Path) -> dict[str, str]:
    """The header the daemon's owner sends (none when the daemon made no token)."""
    path = state_dir / "admin.token"
    return {"Authorization": f"Bearer {path.read_text().strip()}"} if path.exists() else {}


def test_local_admin_needs_the_token_of_the_state_dir(daemons) -> None:
    a = daemons("a", "--group", random_group())
    token_file = a.state_dir / "admin.token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    info = json.loads((a.state_dir / "admin.json").read_text())
    assert info["host"] == "127.0.0.1"
    for path in ("/status", "/metrics", "/subscriptions"):
        status, body = _raw(info, "GET", path, {})
        assert status == 401 and "admin.token" in body["error"], (path, body)
    sink = {"kind": "exec", "target": "true"}
    subscribe = json.dumps({"patterns": {"topic": "t"}, "key": "k", "sink": sink}).encode()
    status, _ = _raw(info, "POST", "/subscribe", {"Content-Type": "application/json"}, subscribe)
    assert status == 401
    # The owner's tools read the token themselves.
    assert a.client().get("/subscriptions") == []
    r = CliRunner().invoke(cli, ["status", "--json", "--state-dir", str(a.state_dir)])
    assert r.exit_code == 0 and json.loads(r.output)["pid"] == info["pid"]
    assert "daemon_" in a.client().get("/metrics")


def test_another_local_user_cannot_use_the_admin_api(daemons, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a throwaway user")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs useradd and runuser")
    a = daemons("a", "--group", random_group())
    info = json.loads((a.state_dir / "admin.json").read_text())
    user = f"dodwan-t{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True, timeout=30)
    try:
        # What that user can do: read admin.json if it can, try the token, call the API.
        probe = (
            "import http.client, json, sys\n"
            "try:\n"
            f"    open({str(a.state_dir / 'admin.token')!r}).read(); print('token read')\n"
            "except OSError as e:\n"
            "    print('token', type(e).__name__)\n"
            f"c = http.client.HTTPConnection({info['host']!r}, {info['port']}, timeout=10)\n"
            "c.request('POST', '/subscribe', body=json.dumps({'patterns': {'topic': 'x'},"
            " 'sink': {'kind': 'exec', 'target': 'id'}}),"
            " headers={'Content-Type': 'application/json'})\n"
            "print('status', c.getresponse().status)\n"
        )
        out = subprocess.run(
            ["runuser", "-u", user, "--", "python3", "-c", probe],
            capture_output=True, text=True, timeout=30, cwd="/",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:2] == ["token PermissionError", "status 401"], out.stdout
        assert a.client().get("/subscriptions") == []
    finally:
        subprocess.run(["userdel", user], check=False, timeout=30)


def test_admin_without_token_opens_loopback_only(daemons, tmp_path: Path) -> None:
    a = daemons("a", "--group", random_group(), "--admin-without-token")
    assert not (a.state_dir / "admin.token").exists()
    info = json.loads((a.state_dir / "admin.json").read_text())
    assert _raw(info, "GET", "/status", {})[0] == 200
    # ... yet never for a web page (DNS rebinding: a foreign name resolving to 127.0.0.1)
    status, body = _raw(info, "GET", "/cache", {}, host=f"attacker.example:{info['port']}")
    assert status == 403 and "host" in body["error"]
    # --allow-remote (for the STOMP gateway, say) does not lift it on a loopback address
    b = daemons("b", "--group", random_group(), "--admin-without-token", "--allow-remote")
    info = json.loads((b.state_dir / "admin.json").read_text())
    assert _raw(info, "GET", "/cache", {}, host="attacker.example")[0] == 403
    text = _refused(tmp_path, "--admin", "127.0.0.2:0", "--allow-remote", "--admin-without-token")
    assert "admin_without_token" in text


def test_web_pages_cannot_drive_the_admin_api(daemons, tmp_path: Path) -> None:
    """A page a browser shows can send a cross-origin POST as text/plain (no preflight), with
    its Origin, and read through DNS rebinding under its own Host: all refused, even with
    the token (which a page has not, but the checks must not depend on it)."""
    a = daemons("a", "--group", random_group())
    info = json.loads((a.state_dir / "admin.json").read_text())
    auth = _bearer(a.state_dir)
    marker = tmp_path / "pwned"
    sink = {"kind": "exec", "target": f"id > {marker}"}
    subscribe = json.dumps({"patterns": {"topic": "csrf"}, "key": "csrf", "sink": sink}).encode()
    for ctype in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
        headers = {**auth, **({"Content-Type": ctype} if ctype else {})}
        status, body = _raw(info, "POST", "/subscribe", headers, subscribe)
        assert status == 415 and "application/json" in body["error"], (ctype, body)
    # raw bodies are for POST /publish only
    headers = {**auth, "Content-Type": "application/octet-stream"}
    assert _raw(info, "POST", "/subscribe", headers, subscribe)[0] == 415
    page = "http://attacker.example"
    headers = {**auth, "Content-Type": "application/json", "Origin": page}
    status, body = _raw(info, "POST", "/subscribe", headers, subscribe)
    assert status == 403 and "Origin" in body["error"]
    status, body = _raw(info, "GET", "/status", {**auth, "Origin": page})
    assert status == 403
    for host in ("attacker.example", f"attacker.example:{info['port']}", "127.0.0.1.nip.io"):
        status, body = _raw(info, "GET", "/subscriptions", auth, host=host)
        assert status == 403 and "localhost" in body["error"], (host, body)
    assert a.client().get("/subscriptions") == []
    # What the daemon's clients send is still accepted.
    headers = {**auth, "Content-Type": "application/json; charset=utf-8"}
    for host in ("localhost", f"localhost:{info['port']}", "127.0.0.1", "[::1]:80", None):
        status, body = _raw(info, "GET", "/status", headers, host=host)
        assert status == 200, (host, body)
    assert _raw(info, "POST", "/subscribe", headers, subscribe)[0] == 200
    assert not marker.exists()


def test_remote_admin_answers_any_host_name_with_the_token(daemons) -> None:
    a = daemons("a", "--group", random_group(), "--admin", "127.0.0.2:0", "--allow-remote")
    info = json.loads((a.state_dir / "admin.json").read_text())
    auth = _bearer(a.state_dir)
    assert _raw(info, "GET", "/status", auth, host="dodwan.example.org:8080")[0] == 200
    assert _raw(info, "GET", "/status", {}, host="dodwan.example.org")[0] == 401
    assert _raw(info, "GET", "/status", {**auth, "Origin": "http://x.example"})[0] == 403


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
    # The admin API stayed local (its token is the one every daemon makes).
    assert json.loads((d.state_dir / "admin.json").read_text())["host"] == "127.0.0.1"
    assert d.alive


def _modes(state_dir: Path, prefix: str) -> dict[str, int]:
    return {
        f.name: stat.S_IMODE(f.stat().st_mode)
        for f in state_dir.iterdir()
        if f.name.startswith(prefix)
    }


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask (0644 files), inherited by the daemons the test starts."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_bridge_credentials_are_owner_only_in_the_write_ahead_log_too(
    tmp_path: Path, umask_022: None
) -> None:
    """bridges.db keeps the bindings' URIs with their passwords; it was made 0600 only after
    journal_mode=WAL had made bridges.db-wal (holding them) 0644."""
    d = DaemonProc(tmp_path / "b", ["--group", random_group()])
    try:
        d.start()
        uri = f"amqp://alice:S3cretPW@127.0.0.1:{_free_port()}/ex/key"
        d.client().post("/bridges", {"uri": uri, "name": "b1", "attributes": {"topic": "t"}})
        wal = d.state_dir / "bridges.db-wal"
        assert b"S3cretPW" in wal.read_bytes()
        modes = _modes(d.state_dir, "bridges.db")
        assert {"bridges.db", "bridges.db-wal", "bridges.db-shm"} <= set(modes), modes
        assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}
    finally:
        d.kill()


def test_state_directory_and_databases_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    """Every payload is in dodwan.db (and joms.sqlite with --stomp): the state directory the
    daemon makes is 0700 and its files 0600, whatever the umask; files an earlier version
    left 0644 are made 0600, and an existing directory open to others is warned about."""
    args = ["--group", random_group(), "--trace"]
    joms = importlib.util.find_spec("joms.stomp.server") is not None
    if joms:
        args += ["--stomp", "127.0.0.1:0"]
    d = DaemonProc(tmp_path / "parent" / "state", args)
    try:
        d.start(make_state_dir=False)
        d.client().publish_bytes(b"CONFIDENTIAL salary table", attributes={"topic": "hr"})
        state = d.state_dir
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        names = ("dodwan.db", "joms.sqlite", "daemon.lock", "admin.token", "trace.jsonl")
        modes = {k: v for n in names for k, v in _modes(state, n).items()}
        expected = {"dodwan.db", "dodwan.db-wal", "daemon.lock", "admin.token"}
        expected |= {"joms.sqlite", "joms.sqlite-wal"} if joms else set()
        assert expected <= set(modes), modes
        assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}
        assert "other users may list it" not in d.log.read_text()
        # A state directory of an earlier version: 0755, its files 0644.
        d.kill()
        state.chmod(0o755)
        for name in modes:
            if (state / name).exists():
                (state / name).chmod(0o644)
        d.start()
        modes = {k: v for n in names for k, v in _modes(state, n).items()}
        assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}
        assert "state directory" in d.log.read_text() and "0755" in d.log.read_text()
    finally:
        d.kill()


def test_a_repaired_database_is_owner_only(tmp_path: Path, umask_022: None) -> None:
    """`dodwan repair` builds dodwan.db.repair (and its log) and moves it over dodwan.db:
    made under the umask, every salvaged payload was readable by other users until the next
    start."""
    d = DaemonProc(tmp_path / "r", ["--group", random_group()])
    try:
        d.start()
        d.client().publish_bytes(b"CONFIDENTIAL salary table", attributes={"topic": "hr"})
    finally:
        d.kill(15)
    r = CliRunner().invoke(cli, ["repair", "--state-dir", str(d.state_dir)])
    assert r.exit_code == 0 and "saved 1 of 1" in r.output, r.output
    modes = _modes(d.state_dir, "dodwan.db")
    assert "dodwan.db" in modes and not any(".repair" in k for k in modes), modes
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}


def test_joms_runtime_state_is_owner_only(tmp_path: Path, umask_022: None) -> None:
    """joms.runtime's LoopbackHost made its state directory, node.sqlite (the cache: every
    payload) and joms.sqlite under the umask."""
    from joms_support import LoopThread

    from joms.runtime import HostConfig, LoopbackHost

    state = tmp_path / "parent" / "j"
    loop = LoopThread()
    try:
        h = loop.call(LoopbackHost(HostConfig("j1", state_dir=state)).start())
        loop.call(h.stop())
    finally:
        loop.close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    modes = {k: v for n in ("node.sqlite", "joms.sqlite") for k, v in _modes(state, n).items()}
    assert {"node.sqlite", "joms.sqlite"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}


def test_a_refused_bridge_uri_never_shows_its_password(daemons, tmp_path: Path) -> None:
    """The daemon's start-up error, POST /bridges and `dodwan bridge add` quoted the refused
    URI whole, password included (logs, the journal, a terminal)."""
    config = tmp_path / "bad.toml"
    config.write_text(
        '[[bridges]]\nname = "cfg1"\nuri = "amqp://alice:CfgLeakPW@127.0.0.1:99999/ex/key"\n'
        'attributes = {topic = "t"}\n'
    )
    text = _refused(tmp_path, "--config", str(config))
    assert "invalid port" in text and "127.0.0.1:99999" in text, text
    assert "CfgLeakPW" not in text and "alice" not in text, text
    a = daemons("a", "--group", random_group())
    info = json.loads((a.state_dir / "admin.json").read_text())
    headers = {**_bearer(a.state_dir), "Content-Type": "application/json"}
    refused = [
        "amqp://alice:ApiLeakPW@127.0.0.1:0/ex/key",  # port 0
        "amqp://alice:ApiLeakPW@127.0.0.1:5672",  # no exchange
        "amqp://alice:ApiLeakPW@127.0.0.1:5672/ex/key?x=1",  # a query
        "mqtt://alice:ApiLeakPW@127.0.0.1:1883//lead",  # empty first level
        "stomp://alice:ApiLeakPW@127.0.0.1:61613/nowhere/x",
        "amqp://alice:ApiLeakPW@127.0.0.1:5672/" + "e" * 300,  # exchange name too long
        "ftp://alice:ApiLeakPW@127.0.0.1/x",  # scheme
        "amqp://alice:Api/LeakPW@127.0.0.1:5672/ex/key",  # a raw '/' in the password
    ]
    for uri in refused:
        body = json.dumps({"uri": uri, "name": "b1", "attributes": {"topic": "t"}}).encode()
        status, answer = _raw(info, "POST", "/bridges", headers, body)
        assert status == 400, (uri, answer)
        assert "LeakPW" not in answer["error"] and "alice" not in answer["error"], answer
        r = CliRunner().invoke(
            cli, ["bridge", "add", uri, "-a", "topic=t", "--state-dir", str(a.state_dir)]
        )
        assert r.exit_code != 0 and "LeakPW" not in r.output, r.output
    assert "LeakPW" not in a.log.read_text()
    assert a.client().get("/bridges") == []
