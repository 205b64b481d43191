"""The README's shell blocks, run as a new user would paste them, against real daemons.

Every ```sh block of the README that uses the daemon, the CLI or the console (they name
the state directories ``/tmp/h1``, ``/tmp/h2``) is run line by line, in order, with three
changes only: the state directories live in the test's temporary directory, each daemon
gets a random multicast group (``--group``) and the STOMP gateway a free port, so parallel
runs do not meet. A line ending in ``&`` starts a background job (``kill %1 %2`` stops them);
the interactive console runs in tmux and is typed the ``joms>`` lines of the block that
follows it; the Python block that connects to the gateway runs with the project's
interpreter; the ``--follow`` stream is read until it printed what the text says, then
interrupted. Each step must do what the README says it does, in the time it says.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_console_terminal import Pane, _env, _free_port, foreground
from test_daemon_helpers import random_group, wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
ANNOUNCE_PERIOD = 5.0  # the default the README's delivery time refers to


@dataclass
class Block:
    lang: str
    lines: list[str]


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        out.append(Block(m.group(1), m.group(2).splitlines()))
    return out


def daemon_blocks(text: str) -> list[tuple[Block, Block | None]]:
    """The sh blocks that use the daemons (and the Python blocks that connect to the
    gateway), each with the block that follows it."""
    all_blocks = blocks(text)
    chosen = []
    for i, b in enumerate(all_blocks):
        uses = (b.lang == "sh" and any("/tmp/h" in x for x in b.lines)) or (
            b.lang == "python" and any("joms.connect(" in x for x in b.lines)
        )
        if uses:
            chosen.append((b, all_blocks[i + 1] if i + 1 < len(all_blocks) else None))
    return chosen


def _python(shell: Shell, block: Block) -> None:
    """A Python example, run by the project's interpreter against the running gateway."""
    code = "\n".join(block.lines).replace("127.0.0.1:61613", shell.stomp)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=shell.env, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, f"{code}\n{r.stdout}{r.stderr}"


def test_the_readme_has_the_daemon_walkthrough() -> None:
    found = daemon_blocks(README.read_text())
    commands = " ".join(x for b, _ in found for x in b.lines)
    for needed in ("dodwan daemon", " subscribe ", " publish ", "--follow", "joms --state-dir"):
        assert needed in commands, needed


@dataclass
class Shell:
    """What a user's shell holds across the pasted lines."""

    tmp: Path
    env: dict[str, str]
    group: str = field(default_factory=random_group)
    stomp: str = field(default_factory=lambda: f"127.0.0.1:{_free_port()}")
    jobs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    tmux_server: str | None = None
    console: Pane | None = None

    def adapt(self, line: str) -> str:
        # /tmp/ first: the checkout (and so BIN) may itself live under /tmp (a CI clone)
        line = line.replace("/tmp/", f"{self.tmp}/").replace(".venv/bin/", f"{BIN}/")
        line = line.replace("127.0.0.1:61613", self.stomp)
        return re.sub(r"(dodwan daemon)", rf"\1 --group {self.group}", line)

    def sh(self, line: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=ROOT)  # fmt: skip


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    (tmp_path / "home").mkdir()
    s = Shell(tmp_path, _env(tmp_path / "home"))
    yield s
    for job in s.jobs:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    if s.tmux_server is not None:
        subprocess.run(["tmux", "-S", s.tmux_server, "kill-server"], capture_output=True)
        shutil.rmtree(os.path.dirname(s.tmux_server), ignore_errors=True)


def _job(shell: Shell, cmd: list[str]) -> None:
    log = open(shell.tmp / f"job{len(shell.jobs) + 1}.log", "wb")  # noqa: SIM115
    shell.jobs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=shell.env, cwd=ROOT))


def _kill(shell: Shell, line: str) -> None:
    for spec in re.findall(r"%(\d+)", line):
        job = shell.jobs[int(spec) - 1]
        job.send_signal(signal.SIGTERM)
        assert job.wait(20) == 0, "a daemon must shut down cleanly on SIGTERM"
    for name in ("h1", "h2"):
        assert not (shell.tmp / name / "admin.json").exists()


def _follow(shell: Shell, line: str) -> None:
    proc = subprocess.Popen(
        shlex.split(line, comments=True), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=shell.env, cwd=ROOT, preexec_fn=foreground,  # stopped with Ctrl-C
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for x in proc.stdout:
            lines.append(x.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()

    try:
        wait_for(lambda: "hello" in lines, 10, what=lambda: f"'hello' from --follow: {lines}")
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rc = proc.wait(10)
    assert rc == 0, lines


def _interactive(shell: Shell, line: str, shown: Block | None) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    assert shown is not None and shown.lang == "", "the prompt session is shown after it"
    sockdir = tempfile.mkdtemp(prefix="readme-tmux-")
    shell.tmux_server = os.path.join(sockdir, "sock")
    cmd = [*shlex.split(line), "--history", str(shell.tmp / "history")]
    shell.console = pane = Pane(shell.tmux_server, "readme", cmd, shell.env)
    pane.wait(f"JOMS console, connected to stomp://{shell.stomp}.")
    for x in shown.lines:
        if x.startswith("joms> "):
            pane.line(x.removeprefix("joms> "))
        else:
            pane.wait(x)  # each line of the shown session, as shown


def _step(shell: Shell, line: str) -> None:
    started = time.monotonic()
    r = shell.sh(line)
    assert r.returncode == 0, f"{line}\n{r.stdout}{r.stderr}"
    out = r.stdout.strip()
    inbox = shell.tmp / "h2-inbox"
    if " subscribe " in line and "--dir" in line:
        assert re.fullmatch(r"dir-[0-9a-f]+", out), out  # the subscription's key
    elif " publish " in line:
        assert re.fullmatch(r"h1-[0-9a-f]+", out), out  # the message's id
        shell.outputs["id"] = out
        # payload file and descriptor, within about two announce periods
        wait_for(lambda: (inbox / f"{out}.json").exists(), 2 * ANNOUNCE_PERIOD + 3,
                 what="hello in /tmp/h2-inbox")  # fmt: skip
        assert (inbox / out).read_text() == "hello"
        assert time.monotonic() - started < 2 * ANNOUNCE_PERIOD + 3
    elif line.startswith("ls ") and "h2-inbox" in line:
        mid = shell.outputs["id"]
        assert out.split() == [mid, f"{mid}.json"], out
    elif " status" in line and "joms" not in line:
        assert "host id" in out and "h2" in out and "subscriptions" in out, out
    elif " top --once" in line:
        assert "neighbours (1)" in out and "h1" in out, out
    elif "joms" in line and " pub " in line:
        assert out == "The message firstMSG has been published to topic ChatRoom1", out
        if shell.console is not None:  # the console subscribed above gets it
            shell.console.wait("[1] topic ChatRoom1 id firstMSG language=English: Hello")
    elif "joms" in line and "-c" in line:
        assert f"daemon     stomp://{shell.stomp}: connected" in out, out
        assert "host id    h2" in out and "topics:  ChatRoom1" in out, out


@pytest.mark.skipif(not (BIN / "dodwan").exists(), reason="needs the .venv entry points")
def test_the_readme_walkthrough_does_what_it_says(shell: Shell) -> None:
    done = []
    for block, after in daemon_blocks(README.read_text()):
        if block.lang == "python":
            _python(shell, block)
            done.append("python")
            continue
        for raw in block.lines:
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            line = shell.adapt(raw)
            words = shlex.split(line, comments=True)
            if words[-1] == "&":
                _job(shell, words[:-1])
            elif line.startswith("kill %"):
                _kill(shell, line)
            elif "--follow" in line:
                _follow(shell, line)
            elif re.fullmatch(r"\S*joms --state-dir \S+", line.strip()):
                _interactive(shell, line, after)
            else:
                _step(shell, line)
            done.append(raw)
    assert "python" in done  # the JMS example ran against h2's gateway
    assert any(x.startswith("kill %") for x in done)  # and the walk-through ends cleanly
