"""Shared helpers for the daemon/CLI process tests: start real ``dodwan daemon`` processes,
wait for readiness by polling their admin API with a deadline, and always kill them.

(Named ``test_*`` so it sits with the daemon tests; it holds one self-test.)
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dodwan.daemon.client import AdminClient, ClientError

T = TypeVar("T")


def wait_for(
    pred: Callable[[], T],
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "",
) -> T:
    """Poll ``pred`` until it returns a truthy value; fail the test after ``timeout``.

    ``what`` names the wait in the failure; a callable is asked only then, so it can say
    what was still missing at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = pred()
        except (ClientError, OSError, ValueError, KeyError) as exc:
            last = exc
            result = None
        else:
            result = last
        if result:
            return result
        if time.monotonic() > deadline:
            name = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout} s waiting for {name or pred}: last {last!r}")
        time.sleep(interval)


def group_alive(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (zombies waiting for a reaper excluded)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


TEST_PORTS = range(20000, 32768)
"""Ports tests give their daemons: below Linux's ephemeral range (32768–60999), where any
process's socket bound to a wildcard address (a resolver's, a broker client's) can sit and
make a daemon's bind fail with "Address already in use" (seen once in a full run)."""


def random_port() -> int:
    return random.SystemRandom().choice(TEST_PORTS)


def random_group() -> str:
    rnd = random.SystemRandom()
    return f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}:{random_port()}"


def admin_auth(state_dir: Path) -> bytes:
    """The ``Authorization`` header line (CRLF included) the daemon of ``state_dir`` wants
    on every admin request, for tests writing raw HTTP."""
    token = (state_dir / "admin.token").read_text(encoding="utf-8").splitlines()[0].strip()
    return f"Authorization: Bearer {token}\r\n".encode()


class DaemonProc:
    """One ``dodwan daemon`` process and its state directory."""

    def __init__(self, state_dir: Path, args: list[str], prefix: list[str] | None = None) -> None:
        self.state_dir = state_dir
        self.args = args
        self.prefix = prefix or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir.parent / f"{state_dir.name}.log"

    def start(self, wait: bool = True, make_state_dir: bool = True) -> DaemonProc:
        """Start it; ``make_state_dir`` false leaves the state directory for the daemon to
        create (its parent, where the log goes, is made)."""
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        if make_state_dir:  # as the daemon makes it (it warns about one open to others)
            self.state_dir.mkdir(mode=0o700, exist_ok=True)
        cmd = [
            *self.prefix,
            sys.executable,
            "-m",
            "dodwan.cli",
            "daemon",
            "--state-dir",
            str(self.state_dir),
            *self.args,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"daemon exited with {self.proc.returncode}: {self.log.read_text()}")
            info = json.loads((self.state_dir / "admin.json").read_text())
            if info["pid"] != self.proc.pid:
                return False
            return bool(self.client().get("/status")["host_id"])

        wait_for(ready, timeout, what=f"daemon {self.state_dir.name} ready")

    def client(self) -> AdminClient:
        return AdminClient.for_state_dir(self.state_dir, timeout=10.0)

    def status(self) -> dict[str, Any]:
        return self.client().get("/status")  # type: ignore[no-any-return]

    def kill(self, sig: int = signal.SIGKILL) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProc]]:
    """Factory: ``daemons(name, *args)`` starts a daemon (ready) and kills it at teardown."""
    started: list[DaemonProc] = []

    def make(
        name: str, *args: str, wait: bool = True, prefix: list[str] | None = None
    ) -> DaemonProc:
        d = DaemonProc(tmp_path / name, list(args), prefix)
        started.append(d)
        return d.start(wait=wait)

    yield make
    for d in started:
        d.kill()
    for d in started:  # a daemon must never log an unhandled exception
        text = d.log.read_text() if d.log.exists() else ""
        assert "Traceback" not in text, f"{d.log}:\n{text}"


def test_wait_for_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", 7])
    assert wait_for(lambda: next(calls), timeout=5, interval=0) == 7


def test_wait_for_names_what_was_missing_at_the_deadline() -> None:
    state = {"missing": 3}

    def progress() -> bool:
        state["missing"] -= 1
        return False

    with pytest.raises(pytest.fail.Exception) as failed:
        wait_for(progress, timeout=0.05, interval=0.01, what=lambda: f"{state['missing']} left")
    assert state["missing"] < 2  # polled more than once, and named after the last poll:
    assert f"waiting for {state['missing']} left: last False" in str(failed.value)


def test_random_group_is_ipv4_multicast() -> None:
    host, port = random_group().split(":")
    assert host.startswith("239.255.") and int(port) in TEST_PORTS
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert TEST_PORTS[-1] < low  # never one the kernel hands out to other sockets
    assert ipaddress.IPv4Address(host).is_multicast


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs under tmp_path (unmounted at teardown)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def fill_disk(disk: Path) -> Path:
    """Fill ``disk`` (a small tmpfs) with a file; returns it (unlink it to make room)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler
