"""What a new user meets first with the daemon and the ``dodwan`` CLI (issue 19).

Real daemon processes on loopback; CLI commands through click's runner or as processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

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
