"""``dodwan top``: the live view in a real terminal (tmux) against real daemons, ``--once``,
and how it judges link quality (issue 19)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ptyrun import run_in_pty
from test_console_terminal import ROOT, Pane, _env, foreground, needs_tmux
from test_daemon_helpers import DaemonProc, random_group, wait_for

from dodwan.cli import cli
from dodwan.top import Sampler

FAST = ["--announce-period", "0.5"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    root = tmp_path_factory.mktemp("top")
    group = random_group()
    # a sends slowly (800 kbit/s): a transfer lasts long enough to be seen in progress
    a = DaemonProc(root / "ta", ["--group", group, "--host-id", "ta", "--bitrate", "800000",
                                 *FAST])  # fmt: skip
    b = DaemonProc(root / "tb", ["--group", group, "--host-id", "tb", *FAST])
    try:
        a.start()
        b.start()
        wait_for(lambda: "ta" in b.status()["neighbours"], 15, what="neighbours")
        yield a, b
    finally:
        a.kill()
        b.kill()


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[Any]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    sockdir = tempfile.mkdtemp(prefix="top-tmux-")
    server = os.path.join(sockdir, "sock")
    (tmp_path / "home").mkdir()

    def open_pane(*args: str) -> Pane:
        cmd = [sys.executable, "-m", "dodwan.cli", *args]
        return Pane(server, "top", cmd, _env(tmp_path / "home"))

    yield open_pane
    subprocess.run(["tmux", "-S", server, "kill-server"], capture_output=True)
    shutil.rmtree(sockdir, ignore_errors=True)


@needs_tmux
def test_top_shows_neighbours_a_transfer_in_progress_and_the_delivery(
    pair: tuple[DaemonProc, DaemonProc], pane: Any, tmp_path: Path
) -> None:
    a, b = pair
    view: Pane = pane("--state-dir", str(b.state_dir), "top", "-n", "0.3")
    # every part drawn (a capture can fall between two parts of one redraw)
    screen = view.wait(
        lambda s: all(w in s for w in ("neighbours (1)", "cache", "MiB", "PER SECOND"))
    )
    [row] = [x for x in screen.splitlines() if " ta " in f" {x} " and "127.0.0.1:" in x]
    assert "s ago" in row and "%" in row, row  # last heard, link quality
    assert "cache" in screen and "MiB" in screen and "PER SECOND" in screen
    run = CliRunner().invoke
    assert run(cli, ["--state-dir", str(b.state_dir), "subscribe", "-p", "topic=big", "--dir",
                     str(tmp_path / "inbox")]).exit_code == 0  # fmt: skip
    payload = tmp_path / "big.bin"
    payload.write_bytes(os.urandom(400_000))  # incompressible: ~4 s at 800 kbit/s
    r = run(cli, ["--state-dir", str(a.state_dir), "publish", "-a", "topic=big", "--file",
                  str(payload)])  # fmt: skip
    mid = r.output.strip()
    screen = view.wait("transfers (1)", timeout=20)
    [line] = [x for x in screen.splitlines() if mid in x]
    assert "━" in line and "%)" in line, line  # a progress bar and "got/total (n%)"
    screen = view.wait(lambda s: "delivered 1" in s and "to dir 1" in s, timeout=30)
    assert "transfers (0)" in screen
    assert (tmp_path / "inbox" / mid).read_bytes() == payload.read_bytes()
    # Ctrl-C, to the view alone (the pane's shell would die of a Ctrl-C typed in the pane,
    # and with it the "[exited N]" line that shows how the view ended)
    shell = subprocess.run([*view.base, "list-panes", "-t", view.name, "-F", "#{pane_pid}"],
                           capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
    [top] = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout.split()
    os.kill(int(top), signal.SIGINT)
    screen = view.wait("[exited ")
    assert "[exited 0]" in screen and "Traceback" not in screen, screen


def test_top_once_prints_one_frame(pair: tuple[DaemonProc, DaemonProc]) -> None:
    _, b = pair
    # sampled over 1.5 s: announcements come every 0.5 s +- 25 %, so a 0.5 s sample could
    # fall between two of them and show a rate of 0 (it did, once, on a loaded CI run)
    r = CliRunner().invoke(cli, ["--state-dir", str(b.state_dir), "top", "--once", "-n", "1.5"])
    assert r.exit_code == 0, r.output
    out = r.output
    for needle in ("tb", "neighbours (1)", "LINK QUALITY", "cache", "transfers", "deliveries",
                   "PER SECOND", "announcements_sent"):  # fmt: skip
        assert needle in out, (needle, out)
    assert "Ctrl-C" not in out
    [ann] = [x for x in out.splitlines() if "announcements_sent" in x]
    assert float(ann.split()[-2]) > 0  # 0.5 s announce period: about 2 per second


def test_top_without_a_daemon_is_one_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "top", "--once"])
    assert r.exit_code == 1 and "no daemon running" in r.output


class _Script:
    """Admin answers at given times (the sampler's maths, without a daemon)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.last_heard: float | None = None
        self.sent = 0

    def get(self, path: str) -> Any:
        if path == "/status":
            return {
                "announce_period": self.period,
                "pid": 1,
                "counters": {"datagrams_sent": self.sent},
            }
        if path == "/peers":
            return {} if self.last_heard is None else {"n": {"last_heard": self.last_heard}}
        return []


def test_link_quality_is_the_share_of_periods_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _Script(period=1.0)
    sampler = Sampler(lambda: script)  # type: ignore[arg-type,return-value]
    now = [100.2]
    monkeypatch.setattr("dodwan.top.time.time", lambda: now[0])
    quality = []
    # heard in periods 100..103, silent in 104 and 105, heard again in 106 and 107
    for t in (100.2, 101.2, 102.2, 103.2, 104.2, 105.2, 106.2, 107.2):
        now[0] = t
        if int(t) not in (104, 105):
            script.last_heard = t - 0.1
        script.sent += 10
        frame = sampler.poll()
        quality.append(frame.quality["n"])
        assert frame.rates in ({}, {"datagrams_sent": pytest.approx(10.0)})
    assert quality[:4] == [1.0, 1.0, 1.0, 1.0]
    assert quality[5] == pytest.approx(4 / 5)  # 100..104 expected, 105 not yet judged
    assert quality[-1] == pytest.approx(6 / 8)


def test_the_deliveries_panel_shows_the_documented_sink_errors() -> None:
    from rich.console import Console

    from dodwan.top import Frame, _deliveries

    counters = {"daemon_deliveries": 3, "sink_deliveries_exec": 2, "sink_errors": 1}
    frame = Frame({"counters": counters}, {}, [], {}, {}, 0.0)
    console = Console(width=120, record=True)
    console.print(_deliveries(frame))
    assert "sink errors 1" in console.export_text()


@needs_tmux
def test_top_says_when_the_daemon_goes_away_and_resumes(pane: Any, tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "gone", ["--group", random_group(), "--host-id", "gone", *FAST])
    d.start()
    try:
        view: Pane = pane("--state-dir", str(d.state_dir), "top", "-n", "0.3")
        view.wait("neighbours (0)")
        d.kill()
        screen = view.wait("daemon not readable:")
        assert "retrying" in screen and "Traceback" not in screen
        d.start()
        view.wait(lambda s: "daemon not readable" not in s and "neighbours (0)" in s)
    finally:
        d.kill()


# ---------------------------------------------------------------------- peer strings

# What a peer chooses and top shows: rich markup (a closing tag that matches nothing made
# rich raise MarkupError), a terminal title change, a C1 CSI, a right-to-left override.
MARKUP = "[/x]"
EVIL = "\x1b]0;pwned\x07\x9b7m\u202eZ"
EVIL_SHOWN = "\\x1b]0;pwned\\x07\\x9b7m\\u202eZ"


def _raw_controls(raw: str) -> list[str]:
    """What a peer put there that must not reach the terminal raw (rich's own colour
    sequences are ``ESC [``, which the peer's strings do not use here)."""
    return [s for s in ("\x1b]0;pwned", "\x07", "\x9b", "\u202e") if s in raw]


def test_render_shows_peer_strings_as_text() -> None:
    """Every string a peer controls, in every part of the view (live and --once alike)."""
    from rich.console import Console

    from dodwan.top import Frame, render

    status = {
        "host_id": f"me{MARKUP}",
        "medium": {"kind": "udp", "group": f"g{MARKUP}", "interface": f"i{EVIL}"},
        "counters": {f"c{MARKUP}{EVIL}": 3},
    }
    peers = {
        f"h{MARKUP}{EVIL}": {
            "address": ["127.0.0.1", 1],
            "last_heard": 0.0,
            "patterns": [{f"k{EVIL}": f"topic{MARKUP}{EVIL}"}],
        }
    }
    cache = [{"id": f"m{MARKUP}{EVIL}", "fragments": 1, "total_fragments": 2, "size": 10,
              "reason": f"r{MARKUP}{EVIL}"}]  # fmt: skip
    frame = Frame(status, peers, cache, {}, {}, 0.0)
    console = Console(width=400, record=True, force_terminal=True)
    console.print(render(frame, problem=f"p{MARKUP}{EVIL}"))
    out = console.export_text()
    assert not _raw_controls(out), out
    for shown in (f"me{MARKUP}", f"g{MARKUP}", f"i{EVIL_SHOWN}", f"c{MARKUP}{EVIL_SHOWN}",
                  f"h{MARKUP}{EVIL_SHOWN}", f"k{EVIL_SHOWN}=topic{MARKUP}{EVIL_SHOWN}",
                  f"m{MARKUP}{EVIL_SHOWN}", f"r{MARKUP}{EVIL_SHOWN}",
                  f"p{MARKUP}{EVIL_SHOWN}"):  # fmt: skip
        assert shown in out, (shown, out)


def test_top_once_in_a_terminal_shows_a_hostile_neighbour_as_text(tmp_path: Path) -> None:
    """A neighbour whose host id and subscription hold markup and escapes: ``top --once``
    in a terminal neither dies of rich markup nor passes the escapes on."""
    from hostile import Victim, announce

    group = random_group()
    me = DaemonProc(tmp_path / "me", ["--group", group, "--host-id", "me", *FAST])
    peer = DaemonProc(tmp_path / "peer", ["--group", group, "--host-id", f"ev{MARKUP}il", *FAST])
    try:
        me.start()
        peer.start()
        peer.client().post("/subscribe", {"patterns": [{"topic": f"{MARKUP}{EVIL}"}],
                                          "sink": {"kind": "dir", "target": str(tmp_path / "in")}})  # fmt: skip
        # forged announcements: a sender name no daemon would take as its host id; sent
        # every announce period, as a neighbour does, until `top` has drawn (a single one
        # was forgotten on a loaded machine before `top` ran)
        forger = Victim(me, group)
        done = threading.Event()

        def forge() -> None:
            while True:
                forger.sock.sendto(announce(f"f{EVIL}"), forger.dest)
                if done.wait(0.5):
                    return

        sender = threading.Thread(target=forge, daemon=True)
        sender.start()
        try:
            wait_for(
                lambda: (
                    f"f{EVIL}" in me.status()["neighbours"]
                    and any(p["patterns"] for p in me.client().get("/peers").values())
                ),
                15,
                what="both neighbours and the peer's profile",
            )
            rc, raw = run_in_pty([sys.executable, "-m", "dodwan.cli", "--state-dir",
                                  str(me.state_dir), "top", "--once", "-n", "0.3"])  # fmt: skip
        finally:
            done.set()
            sender.join()
            forger.sock.close()
    finally:
        peer.kill()
        me.kill()
    assert rc == 0 and "MarkupError" not in raw, raw
    assert not _raw_controls(raw), repr(raw)
    assert f"ev{MARKUP}il" in raw and f"topic={MARKUP}{EVIL_SHOWN}" in raw, raw
    assert f"f{EVIL_SHOWN}" in raw, raw


def test_top_into_a_file_or_a_pipe_appends_plain_frames(
    pair: tuple[DaemonProc, DaemonProc], tmp_path: Path
) -> None:
    """``dodwan top > file`` wrote 0 bytes (a full-screen view, on no screen), even after
    Ctrl-C; ``| head`` got nothing. Now: a plain frame per refresh; cut off, exit 141."""
    _, b = pair
    cmd = [sys.executable, "-m", "dodwan.cli", "--state-dir", str(b.state_dir), "top", "-n", "0.2"]
    env = {**_env(tmp_path / "home"), "COLUMNS": "100"}
    out = tmp_path / "top.txt"
    with out.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                                preexec_fn=foreground)  # fmt: skip
    try:
        text = wait_for(lambda: (t := out.read_text()).count("neighbours (1)") >= 2 and t, 20,
                        what=lambda: f"two frames in {out}: {out.read_text()!r}")  # fmt: skip
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "\x1b" not in text  # plain text: no cursor movement, no colours
    lines = text.splitlines()
    assert all(len(x) <= 100 for x in lines), max(map(len, lines))
    assert sum(x.startswith("tb  up ") for x in lines) >= 2 and "PER SECOND" in text
    assert "Ctrl-C to quit" not in text
    head = subprocess.run(f"{shlex.join(cmd)} | head -3; echo ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=30)  # fmt: skip
    assert head.stdout.splitlines()[-1] == "141" and head.stderr == "", head
    assert head.stdout.splitlines()[1].startswith("tb  up ")


@pytest.mark.parametrize("width", [40, 60, 120])
def test_a_narrow_terminal_keeps_neighbours_host_ids_and_link_shares(width: int) -> None:
    """At 40 columns the host id used to be squeezed to '…' first and the share heard and the
    profile dropped: the bar and the address give way now."""
    from rich.console import Console

    from dodwan.top import Frame, render

    status = {"host_id": "pa", "medium": {"kind": "udp", "group": "g", "interface": "lo"}}
    long_pattern = {"_joms_dest": "topic:news@*", "_joms_kind": "x" * 30}
    peers = {
        "pb": {"address": ["127.0.0.1", 47613], "silent_for": 0.2, "patterns": [long_pattern]},
        "field-unit-07": {"address": ["127.0.0.1", 47614], "silent_for": 1.5, "patterns": []},
    }
    frame = Frame(status, peers, [], {}, {"pb": 0.6, "field-unit-07": 0.25}, 0.0)
    console = Console(width=width, record=True)
    console.print(render(frame))
    lines = console.export_text().splitlines()
    pb = next(x for x in lines if "│ pb " in x)
    unit = next(x for x in lines if "│ field-unit-07 " in x)
    assert "60%" in pb and "25%" in unit, lines
    assert "_joms_d" in pb, lines  # some of the profile
    assert max(len(x) for x in lines) <= width
