"""What a new user meets first with the daemon and the ``dodwan`` CLI (issue 19).

Real daemon processes on loopback; CLI commands through click's runner or as processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_daemon_helpers import DaemonProc, random_group, wait_for

from dodwan.cli import cli

FAST = ["--announce-period", "0.5"]


def run(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(
        tmp_path_factory.mktemp("first-use") / "state",
        ["--group", random_group(), "--host-id", "first", *FAST],
    )
    d.start()
    yield d
    d.kill()
    assert "Traceback" not in d.log.read_text()


@pytest.fixture
def sd(daemon: DaemonProc) -> str:
    return str(daemon.state_dir)


class Lines:
    """A process whose stdout lines are collected as they come."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, needle: str, timeout: float = 15.0) -> str:
        found: str = wait_for(
            lambda: next((x for x in self.lines if needle in x), None),
            timeout,
            what=lambda: f"{needle!r} in {self.lines}",
        )
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


# ---------------------------------------------------------------------- 1. follow


def test_follow_gets_matching_messages_already_cached(daemon: DaemonProc, sd: str) -> None:
    """The README's first example: publish, then subscribe --follow: "hello" arrives."""
    mid = run("--state-dir", sd, "publish", "-a", "topic=early", "--text", "hello").output.strip()
    before = daemon.status()["counters"].get("sink_deliveries_follow_unattended", 0)
    follower = Lines(
        [sys.executable, "-m", "dodwan.cli", "--state-dir", sd, "subscribe", "-p", "topic=early",
         "--follow", "--json"]
    )  # fmt: skip
    try:
        line = follower.wait_line('"text": "hello"')
        item = json.loads(line)
        assert item["descriptor"]["id"] == mid
    finally:
        follower.stop()
    after = daemon.status()["counters"].get("sink_deliveries_follow_unattended", 0)
    assert after == before


def test_follow_api_gets_what_is_cached_before_the_stream(daemon: DaemonProc) -> None:
    client = daemon.client()
    mids = {
        client.post("/publish", {"attributes": {"topic": "api-early"}, "text": t})["id"]
        for t in ("one", "two")
    }
    stream = client.stream("/follow", {"patterns": [{"topic": "api-early"}], "key": "early"})
    items: list[dict[str, object]] = []

    def read() -> None:
        for item in stream:
            items.append(item)

    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: len(items) >= 3, 15, what=lambda: f"3 items in {items}")
    assert items[0] == {"subscribed": "early"}
    assert {i["descriptor"]["id"] for i in items[1:]} == mids  # type: ignore[index]


# ---------------------------------------------------------------------- 4. output


def test_status_rows_are_aligned_and_sizes_are_labelled(sd: str, tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 5_000_000)
    mid = run("--state-dir", sd, "publish", "-a", "topic=big", "--file", str(big)).output.strip()
    out = run("--state-dir", sd, "status").output.splitlines()
    head = out[: out.index("counters")]
    assert [x.split()[0] for x in head] == [
        "host", "uptime", "medium", "neighbours", "cache", "peer", "subscriptions"
    ]  # fmt: skip
    columns = {len(x) - len(x[x.index("  ") :].lstrip()) for x in head}
    assert len(columns) == 1, head  # every value starts in the same column
    [cache] = [x for x in head if x.startswith("cache")]
    assert " MiB" in cache and " MB" not in cache, cache
    [peer] = [x for x in head if x.startswith("peer state")]
    assert "of 64.0 MiB" in peer, peer  # what peers make it keep, against its budget
    [row] = [x for x in run("--state-dir", sd, "cache", "ls").output.splitlines() if mid in x]
    assert "4.8 MiB" in row, row  # 5,000,000 bytes are 4.77 MiB (and 5.0 MB)
    assert "4.8 MiB" in run("--state-dir", sd, "cache", "show", mid).output
    run("--state-dir", sd, "cache", "purge", mid)


def test_altruistic_wording_on_a_subscriber(tmp_path: Path) -> None:
    group = random_group()
    pub = DaemonProc(tmp_path / "pub", ["--group", group, "--host-id", "pub", *FAST]).start()
    sub = DaemonProc(tmp_path / "sub", ["--group", group, "--host-id", "sub", *FAST]).start()
    try:
        inbox = tmp_path / "inbox"
        key = run("--state-dir", str(sub.state_dir), "subscribe", "-p", "topic=gone", "--dir",
                  str(inbox)).output.strip()  # fmt: skip
        mid = run("--state-dir", str(pub.state_dir), "publish", "-a", "topic=gone", "--text",
                  "x").output.strip()  # fmt: skip
        wait_for(lambda: (inbox / f"{mid}.json").exists(), 30, what="delivery to sub")
        assert run("--state-dir", str(sub.state_dir), "unsubscribe", key).exit_code == 0
        shown = run("--state-dir", str(sub.state_dir), "cache", "show", mid).output
        [kept] = [x for x in shown.splitlines() if x.startswith("kept")]
        assert "altruistic" not in kept, kept  # the host runs without --altruistic
        assert "no longer wanted here" in kept, kept
    finally:
        pub.kill()
        sub.kill()


# ---------------------------------------------------------------------- 5. consistency


def test_dodwan_sim_takes_dash_h() -> None:
    from sim.cli import main

    for args in (["-h"], ["run", "-h"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0 and "Usage: " in r.output, r.output


def test_unsubscribe_takes_json(sd: str, tmp_path: Path) -> None:
    key = run("--state-dir", sd, "subscribe", "-p", "topic=j", "--dir", str(tmp_path)).output
    r = run("--state-dir", sd, "unsubscribe", key.strip(), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"unsubscribed": key.strip()}


def test_publish_without_attributes_is_refused(daemon: DaemonProc, sd: str) -> None:
    before = len(daemon.client().get("/cache"))
    r = run("--state-dir", sd, "publish", "--text", "hi")
    assert r.exit_code != 0
    assert "give at least one attribute (-a NAME=VALUE" in r.output, r.output
    assert len(daemon.client().get("/cache")) == before  # nothing published


def test_cache_show_writes_a_binary_payload_to_a_file(sd: str, tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    mid = run("--state-dir", sd, "publish", "-a", "topic=bin", "--file", str(src)).output.strip()
    dest = tmp_path / "out.bin"
    r = run("--state-dir", sd, "cache", "show", mid, "--output", str(dest))
    assert r.exit_code == 0, r.output
    assert dest.read_bytes() == data
    assert f"payload    written to {dest}" in r.output
    raw = run("--state-dir", sd, "cache", "show", mid, "-o", "-")
    assert raw.stdout_bytes == data  # nothing else on stdout


def test_cache_show_puts_a_separator_before_a_text_payload(sd: str) -> None:
    mid = run("--state-dir", sd, "publish", "-a", "topic=txt", "--text", "line one").output.strip()
    lines = run("--state-dir", sd, "cache", "show", mid, "--payload").output.splitlines()
    assert lines[-2:] == ["--- payload (8 bytes)", "line one"], lines


# ---------------------------------------------------------------------- 6. docs

ROOT = Path(__file__).resolve().parent.parent


def test_no_reference_to_design_notes_outside_the_repository() -> None:
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    citing = [
        f
        for f in files
        if f.endswith((".py", ".md", ".toml", ".txt"))
        and f != "tests/test_first_use.py"
        and ("DESIGN.md" in (ROOT / f).read_text() or "STYLE.md" in (ROOT / f).read_text())
    ]
    assert citing == []


def test_architecture_names_every_module_and_only_existing_ones() -> None:
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    for package in ("dodwan/core", "dodwan/daemon"):
        for path in sorted((ROOT / package).glob("[!_]*.py")):
            assert f"`{path.name}`" in text or f"{package}/{path.name}" in text, path
    for named in re.findall(r"`((?:dodwan|joms|console|sim)/[\w/]+\.py)`", text):
        assert (ROOT / named).exists(), named
    for named in re.findall(r"`(docs/[\w-]+\.md)`", text):
        assert (ROOT / named).exists(), named


def test_auto_acknowledge_is_documented_as_the_code_does_it() -> None:
    [row] = [
        x
        for x in (ROOT / "docs" / "joms.md").read_text().splitlines()
        if "`AUTO_ACKNOWLEDGE` |" in x
    ]
    assert "after the listener returns" in row and "gets it" not in row, row


def test_wait_gives_a_starting_daemon_time_then_says_why(tmp_path: Path) -> None:
    import time

    started = time.monotonic()
    r = run("--state-dir", str(tmp_path / "none"), "--wait", "0.5", "status")
    assert time.monotonic() - started >= 0.5
    assert r.exit_code == 1 and "no daemon running" in r.output
    group = random_group()
    d = DaemonProc(tmp_path / "late", ["--group", group, "--host-id", "late"])
    d.start(wait=False)  # not yet serving: status waits for it
    try:
        r = run("--state-dir", str(d.state_dir), "--wait", "20", "status", "--json")
        assert r.exit_code == 0 and json.loads(r.output)["host_id"] == "late"
    finally:
        d.kill()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_wait_also_waits_out_a_stale_admin_json_whose_pid_is_alive(tmp_path: Path) -> None:
    """A killed daemon's admin.json names a closed port, and its PID may be another live
    process's (reused, or the daemon not yet reaped): ``--wait`` gave up at once on the
    refused connection instead of waiting for the daemon that is starting."""
    import os
    import time

    state = tmp_path / "stale"
    state.mkdir()
    stale = {"host": "127.0.0.1", "port": _closed_port(), "pid": os.getpid(), "host_id": "x"}
    (state / "admin.json").write_text(json.dumps(stale))
    started = time.monotonic()
    r = run("--state-dir", str(state), "--wait", "1", "status")
    assert time.monotonic() - started >= 1
    assert r.exit_code == 1 and "is not reachable (not running?); waited 1 s" in r.output
    # a daemon starting after the command: it writes a new admin.json, the command finds it
    cmd = [sys.executable, "-m", "dodwan.cli", "--state-dir", str(state), "--wait", "30"]
    status = subprocess.Popen(
        [*cmd, "status", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    d = DaemonProc(state, ["--group", random_group(), "--host-id", "late"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # still waiting, not given up
            status.wait(timeout=1)
        d.start(wait=False)
        out, err = status.communicate(timeout=40)
        assert status.returncode == 0, err
        assert json.loads(out)["host_id"] == "late"
    finally:
        status.kill()
        status.wait()
        d.kill()
