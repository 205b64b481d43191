"""The real ``joms`` console in real terminals (tmux panes and a pty) against real daemons.

Two ``dodwan daemon`` processes with the STOMP gateway run on loopback for the module. The
tests type into consoles like a person would and read the screen: the paper's example
between two consoles on two daemons, a message arriving while a line is being typed,
bad input, history and completion, a daemon that goes away and comes back, and the
non-interactive modes (one command, ``-c``, commands piped on stdin).

Every wait polls the screen or the output with a deadline: there is no event to await in
another process's terminal.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from brokers import free_port as _free_port  # outside the ephemeral range
from test_daemon_helpers import DaemonProc, random_group, wait_for

import joms as jms

ROOT = Path(__file__).resolve().parent.parent
TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install -y tmux)"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>]|\x1b\][^\x07]*\x07")


def foreground() -> None:
    """``preexec_fn`` of a command a test stops with SIGINT as Ctrl-C would: it gets SIGINT
    and SIGQUIT at their defaults, as a terminal's foreground job does. A suite started as
    a background job of a non-interactive shell (``nohup make test &``) runs with both
    ignored, its children inherit that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Host:
    """A daemon with its STOMP port."""

    def __init__(self, root: Path, host_id: str, group: str) -> None:
        self.host_id = host_id
        self.port = _free_port()
        self.url = f"127.0.0.1:{self.port}"
        args = ["--host-id", host_id, "--group", group, "--stomp", self.url]
        args += ["--announce-period", "0.5"]
        self.daemon = DaemonProc(root / host_id, args)

    @property
    def state_dir(self) -> Path:
        return self.daemon.state_dir

    def start(self) -> Host:
        self.daemon.start()
        wait_for(self._stomp_up, 10, what=f"STOMP gateway of {self.host_id}")
        return self

    def _stomp_up(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2):
            return True


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Host]]:
    root = tmp_path_factory.mktemp("console-net")
    group = random_group()
    a, b = Host(root, "ca", group), Host(root, "cb", group)
    try:
        a.start()
        b.start()
        wait_for(lambda: "cb" in a.daemon.status()["neighbours"], 15, what="neighbours")
        yield a, b
    finally:
        a.daemon.kill()
        b.daemon.kill()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def _env(home: Path) -> dict[str, str]:
    # COLUMNS/LINES: the terminal's size is the pane's or the pty's own, never the test
    # runner's (pytest-xdist workers export COLUMNS=80, which rich would obey)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DODWAN_", "TMUX")) and k not in ("COLUMNS", "LINES")
    }
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_STATE_HOME=str(home / "state"),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def joms(*args: str) -> list[str]:
    return [sys.executable, "-m", "console.cli", *args]


def run_joms(
    home: Path, *args: str, input: str | None = None, timeout: float = 30
) -> tuple[int, str, str]:
    p = subprocess.run(
        joms(*args),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(home),
        cwd=ROOT,
    )
    return p.returncode, p.stdout, p.stderr


# ---------------------------------------------------------------- tmux


class Pane:
    """A console in its own tmux pane: type into it and read its screen."""

    def __init__(self, server: str, name: str, cmd: list[str], env: dict[str, str]) -> None:
        assert TMUX is not None
        self.base = [TMUX, "-S", server]
        self.name = name
        shell = f'{shlex.join(cmd)}; echo "[exited $?]"; sleep 600'
        env = {**env, "TERM": "screen"}  # what tmux emulates, whatever runs the tests
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.isidentifier())
        subprocess.run(
            [*self.base, "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
             "-c", str(ROOT), f"env -i {exports} sh -c {shlex.quote(shell)}"],
            check=True,
        )  # fmt: skip

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, "-l", text], check=True)

    def line(self, text: str) -> None:
        self.type(text)
        self.keys("Enter")

    def screen(self) -> str:
        out = subprocess.run(
            [*self.base, "capture-pane", "-p", "-J", "-S", "-", "-t", self.name],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    def wait(self, want: str | Callable[[str], bool], timeout: float = 15.0) -> str:
        test = (lambda s: want in s) if isinstance(want, str) else want
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if test(text):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"pane {self.name}: timed out waiting for {want!r}; screen:\n{text}")
            time.sleep(0.05)

    def last_line(self) -> str:
        lines = [x for x in self.screen().splitlines() if x.strip()]
        return lines[-1] if lines else ""


@pytest.fixture
def tmux(home: Path) -> Iterator[Callable[..., Pane]]:
    if TMUX is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    sockdir = tempfile.mkdtemp(prefix="joms-tmux-")  # short: socket paths are limited
    server = os.path.join(sockdir, "sock")
    count = iter(range(100))

    def open_console(*args: str, history: Path | None = None) -> Pane:
        hist = history or home / f"history-{next(count)}"
        pane = Pane(server, f"c{next(count)}", joms("--history", str(hist), *args), _env(home))
        pane.wait("joms>")  # capture-pane drops trailing spaces
        return pane

    yield open_console
    subprocess.run([TMUX, "-S", server, "kill-server"], capture_output=True)
    shutil.rmtree(sockdir, ignore_errors=True)


def _lines_with(screen: str, *needles: str) -> list[str]:
    return [x for x in screen.splitlines() if all(n in x for n in needles)]


@needs_tmux
def test_two_consoles_exchange_the_papers_example(
    net: tuple[Host, Host], tmux: Callable[..., Pane]
) -> None:
    a, b = net
    host1 = tmux("--url", a.url)
    host2 = tmux("--url", b.url)
    host2.line("sub -t ChatRoom1 -ssl language=English|French")
    host2.wait("Waiting ....")
    host1.line("pub -t ChatRoom1 -id otherMSG -p Hallo -ssl language=German")
    host1.line("pub -t ChatRoom1 -id firstMSG -p Hello -ssl language=English")
    host1.wait("The message firstMSG has been published")
    screen = host2.wait(lambda s: bool(_lines_with(s, "Hello", "ChatRoom1", "firstMSG")))
    [line] = _lines_with(screen, "Hello", "ChatRoom1", "firstMSG")
    assert line == "[1] topic ChatRoom1 id firstMSG language=English: Hello"
    assert "Hallo" not in screen  # German is outside the pattern
    host2.line("subscriptions")
    host2.wait("(1 received)")


@needs_tmux
def test_a_message_arriving_while_typing_keeps_the_line(
    net: tuple[Host, Host], tmux: Callable[..., Pane], home: Path
) -> None:
    a, b = net
    pane = tmux("--url", b.url)
    pane.line("sub -t Typing")
    pane.wait("Waiting ....")
    pane.type("subscrip")
    pane.wait(lambda s: s.rstrip().endswith("joms> subscrip"))
    rc, _, err = run_joms(home, "--url", a.url, "pub", "-t", "Typing", "-id", "live", "-p",
                            "arrived", "while", "typing")  # fmt: skip
    assert rc == 0, err
    screen = pane.wait("arrived while typing")
    assert _lines_with(screen, "[1] topic Typing id live: arrived while typing")
    pane.wait(lambda s: s.rstrip().endswith("joms> subscrip"))  # redrawn below the arrival
    pane.type("tions")
    pane.keys("Enter")
    pane.wait("(1 received)")


@needs_tmux
def test_bad_input_prints_usage_and_the_console_goes_on(
    net: tuple[Host, Host], tmux: Callable[..., Pane]
) -> None:
    a, _ = net
    pane = tmux("--url", a.url)
    cases = [
        ("pub -t X", "error: one of the arguments -p -f is required"),
        ("frobnicate now", "error: unknown command 'frobnicate'"),
        ("sub -t X -ssl bad=(", "error: bad regular expression '(' for bad"),
        ('pub -t X -p "open', "error: cannot read the line: No closing quotation"),
        ("pub -t X -p x --priority 99", "error: argument --priority: invalid choice: 99"),
        ("receive -q Empty --timeout 0.3", "error: no message on queue Empty within 0.3 s"),
        ("peers", "--state-dir DIR"),
        ("unsub 7", "error: no subscription 7"),
        ("pub -t X -ssl id=1 -p x", "property name 'id' is reserved"),
        ("sub -t D --durable keep", "start the console with --client-id ID"),
        ("send -q Nope@* -p x", "error: the daemon refused: queue 'Nope' is not known"),
        ("pub -t Fine -p after the refusal", "has been published to topic Fine"),
    ]
    for line, expected in cases:
        pane.line(line)
        pane.wait(expected)
    screen = pane.screen()
    assert screen.count("usage: pub -t TOPIC") >= 3
    assert "Traceback" not in screen and "[exited" not in screen
    assert "connection to the daemon lost" not in screen  # a refusal is not a loss
    pane.line("help pub")
    pane.wait("example: pub -t ChatRoom1 -id firstMSG -p Hello -ssl language=English")
    pane.line("exit")
    pane.wait("[exited 0]")


@needs_tmux
def test_receive_from_a_queue_managed_on_another_host(
    net: tuple[Host, Host], tmux: Callable[..., Pane], home: Path
) -> None:
    """``receive -q Remote@cb`` typed on ca, one message at a time: each is shown once, for
    the first time without ``(redelivered)`` (each receiver is handed several and closes
    after the first, before the others have all reached it), and each comes promptly (the issue saw ~11 s)."""
    a, b = net
    rc, out, err = run_joms(home, "--url", b.url, "create", "queue", "Remote")
    assert rc == 0 and "managed by this host" in out, err
    script = "; ".join(f"send -q Remote@cb -id r{i} -p job {i}" for i in range(10))
    rc, _, err = run_joms(home, "--url", a.url, "-c", script)
    assert rc == 0, err
    with jms.connect(f"stomp://{b.url}") as conn:  # all ten wait at the manager
        browser = conn.create_session().create_browser(jms.Queue("Remote@cb"))
        wait_for(lambda: len(browser.messages()) == 10, 20, what="10 messages at the manager")
    pane = tmux("--url", a.url)
    shown: list[str] = []
    for n in range(1, 4):
        started = time.monotonic()
        pane.line("receive -q Remote@cb --timeout 30")
        screen = pane.wait(lambda s, n=n: len(_lines_with(s, "queue Remote@cb id")) == n, 30)
        took = time.monotonic() - started
        shown = _lines_with(screen, "queue Remote@cb id")
        assert took < 8.0, f"receive took {took:.1f} s: {shown[-1]}"
    assert not [x for x in shown if "(redelivered)" in x], shown
    assert len(set(shown)) == 3 and all(
        re.fullmatch(r"queue Remote@cb id r\d: job \d", x) for x in shown
    )


@needs_tmux
def test_history_between_runs_and_tab_completion(
    net: tuple[Host, Host], tmux: Callable[..., Pane], home: Path
) -> None:
    a, _ = net
    history = home / "kept-history"
    first = tmux("--url", a.url, history=history)
    first.line("pub -t Hist -p one")
    first.wait("has been published to topic Hist")
    first.line("exit")
    first.wait("[exited 0]")
    assert "pub -t Hist -p one" in history.read_text()

    second = tmux("--url", a.url, history=history)
    second.keys("Up")
    second.wait(lambda s: s.rstrip().endswith("joms> exit"))
    second.keys("Up")
    second.wait(lambda s: s.rstrip().endswith("joms> pub -t Hist -p one"))
    second.keys("C-u")
    second.type("subscr")
    second.keys("Tab")
    second.wait(lambda s: s.rstrip().endswith("joms> subscriptions"))
    second.keys("Enter")
    second.wait("no subscriptions")
    second.line("create topic Tabbed")
    second.wait("topic Tabbed is ready")
    second.type("pub -t Tab")
    second.keys("Tab")
    second.wait(lambda s: s.rstrip().endswith("joms> pub -t Tabbed"))
    second.type(" --non")
    second.keys("Tab")
    second.wait(lambda s: s.rstrip().endswith("joms> pub -t Tabbed --non-persistent"))
    second.line(" -p done")
    second.wait("has been published to topic Tabbed")


@needs_tmux
def test_the_console_waits_for_its_daemon_and_reconnects_after_a_loss(
    tmp_path: Path, tmux: Callable[..., Pane]
) -> None:
    host = Host(tmp_path, "cr", random_group())
    try:
        pane = tmux("--url", host.url)  # before the daemon: the console waits for it
        pane.wait(f"cannot reach the daemon at {host.url}")
        pane.wait("retrying in the background")
        host.start()
        pane.wait(f"! connected to the daemon at {host.url}")
        pane.line("sub -t Back")
        pane.wait("Waiting ....")
        host.daemon.kill(signal.SIGKILL)
        pane.wait("! connection to the daemon lost")
        pane.line("pub -t Back -p nobody")
        pane.wait(f"error: cannot reach the daemon at {host.url}")
        host.start()
        pane.wait("! reconnected to the daemon at " + host.url + "; 1 subscription restored")
        pane.line("pub -t Back -id again -p after restart")
        pane.wait("[1] topic Back id again: after restart")
        assert "[exited" not in pane.screen()
    finally:
        host.daemon.kill()


# ---------------------------------------------------------------- pty


class PtyConsole:
    """A console on a pseudo-terminal of our own (stdlib pty): no tmux needed."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        env = {**env, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
        self.proc = subprocess.Popen(
            args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.seen = ""

    def read_until(self, needle: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while needle not in ANSI.sub("", self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"pty: no {needle!r} within {timeout} s; got:\n{self.text()}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the console exited
                    time.sleep(0.05)
        return self.text()

    def text(self) -> str:
        return ANSI.sub("", self.seen).replace("\r", "")

    def write(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait(10)
        os.close(self.master)
        return rc


def test_papers_example_in_a_pty(net: tuple[Host, Host], home: Path) -> None:
    a, b = net
    console = PtyConsole(joms("--url", b.url, "--history", str(home / "h")), _env(home))
    try:
        console.read_until("joms>")
        console.write("sub -t PtyRoom -ssl language=English|French\r")
        console.read_until("Waiting ....")
        rc, out, err = run_joms(home, "--url", a.url, "pub", "-t", "PtyRoom", "-id", "firstMSG",
                                "-p", "Hello", "-ssl", "language=English")  # fmt: skip
        assert rc == 0 and "has been published" in out, err
        text = console.read_until("Hello")
        assert "topic PtyRoom id firstMSG language=English: Hello" in text
        console.write("exit\r")
        assert console.proc.wait(10) == 0
    finally:
        console.close()


# What a peer chooses: a JOMS property, label and body, a topic named in a directory advert
# (any host may publish one), a host id in a forged announcement. Raw, they clear and retitle
# the terminal (ESC, OSC, C1 CSI) or reverse the rest of the line (U+202E).
EVIL = "A\x1b[41m\x1b]0;pwned\x07B\x9b7mC\u202eDEF"
EVIL_SHOWN = "A\\x1b[41m\\x1b]0;pwned\\x07B\\x9b7mC\\u202eDEF"


def test_what_peers_chose_is_escaped_in_a_terminal(tmp_path: Path, home: Path) -> None:
    from hostile import Victim, announce

    group = random_group()
    a, b = Host(tmp_path, "ea", group), Host(tmp_path, "eb", group)
    console = None
    try:
        a.start()
        b.start()
        wait_for(lambda: "ea" in b.daemon.status()["neighbours"], 15, what="neighbours")
        console = PtyConsole(joms("--url", b.url, "--state-dir", str(b.state_dir), "--history",
                                  str(home / "h")), _env(home))  # fmt: skip
        console.read_until("joms>")
        console.write("sub -t Evil\r")
        console.read_until("Waiting ....")
        with jms.connect(f"stomp://{a.url}") as conn:
            s = conn.create_session(transacted=False, ack_mode=jms.AUTO_ACKNOWLEDGE)
            msg = s.create_text_message(f"body{EVIL}", {"label": f"L{EVIL}", "color": f"c{EVIL}"})
            s.create_producer(s.create_topic("Evil")).send(msg)
        console.read_until(f"body{EVIL_SHOWN}")
        advert = json.dumps({"topics": [f"ev{EVIL}il"], "queues": []})
        r = subprocess.run(
            [sys.executable, "-m", "dodwan.cli", "--state-dir", str(a.state_dir), "publish",
             "-a", "jms_kind=directory", "-a", "destination_type=topic",
             "-a", "destination_id=directory", "--text", advert, "--ttl", "600"],
            capture_output=True, text=True, cwd=ROOT, env=_env(home),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        advert_id = r.stdout.strip()
        wait_for(lambda: any(it["id"] == advert_id and it["complete"]
                             for it in b.daemon.client().get("/cache")),
                 15, what="the advert at eb")  # fmt: skip
        forger = Victim(b.daemon, group)
        try:
            forger.sock.sendto(announce(f"f{EVIL}"), forger.dest)
            wait_for(lambda: f"f{EVIL}" in b.daemon.status()["neighbours"], 15, what="forger")
        finally:
            forger.sock.close()
        console.write("destinations\r")
        console.read_until("queues:")
        console.write("peers\r")
        console.read_until(f"f{EVIL_SHOWN}  127.0.0.1:")
        console.write("exit\r")
        assert console.proc.wait(10) == 0
    finally:
        if console is not None:
            console.close()
        a.daemon.kill()
        b.daemon.kill()
    text = console.text()
    assert f"[1] topic Evil id L{EVIL_SHOWN} color=c{EVIL_SHOWN}: body{EVIL_SHOWN}" in text
    # (the prompt may come first on the line: the output of a command typed is not awaited)
    [topics] = [x.split("topics:", 1)[1] for x in text.splitlines() if "topics:" in x]
    assert f"ev{EVIL_SHOWN}il" in topics.strip().split(", "), topics
    for raw in ("\x1b]0;pwned", "\x9b", "\u202e"):  # in what reached the terminal, unfiltered
        assert raw not in console.seen, (raw, console.seen)


# ---------------------------------------------------------------- non-interactive


class Follower:
    """A one-shot console whose output lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str], stdin: int | None = None) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
            stdin=stdin, preexec_fn=foreground,  # it is stopped with Ctrl-C
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, needle: str, timeout: float = 15.0) -> str:
        found = wait_for(
            lambda: next((x for x in self.lines if needle in x), None), timeout, what=needle
        )
        return str(found)


def test_a_clean_daemon_restart_is_a_lost_connection_not_a_refusal(
    tmp_path: Path, home: Path
) -> None:
    """SIGTERM: the gateway says ``ERROR the server is stopping`` before it closes; the
    console announces the loss and the reconnection (docs/console.md), as after SIGKILL,
    not a renewal "after the refusal" of a request nobody made."""
    host = Host(tmp_path, "cs", random_group()).start()
    sub = Follower(joms("--url", host.url, "sub", "-t", "Restart", "--count", "2"), _env(home))
    try:
        sub.wait_line("Waiting ....")
        rc, _, err = run_joms(home, "--url", host.url, "pub", "-t", "Restart", "-id", "r1",
                              "-p", "first")  # fmt: skip
        assert rc == 0, err
        sub.wait_line("[1] topic Restart id r1: first")
        assert host.daemon.kill(signal.SIGTERM) == 0  # a clean stop
        sub.wait_line("! connection to the daemon lost (the server is stopping); reconnecting")
        host.start()
        sub.wait_line(f"! reconnected to the daemon at {host.url}; 1 subscription restored")
        rc, _, err = run_joms(home, "--url", host.url, "pub", "-t", "Restart", "-id", "r2",
                              "-p", "second")  # fmt: skip
        assert rc == 0, err
        assert sub.proc.wait(20) == 0, sub.lines
        assert "[1] topic Restart id r2: second" in sub.lines
        assert not any("refusal" in x for x in sub.lines), sub.lines
    finally:
        if sub.proc.poll() is None:
            sub.proc.kill()
        host.daemon.kill()


def test_one_shot_commands(net: tuple[Host, Host], home: Path) -> None:
    a, b = net
    sub = Follower(
        joms("--url", b.url, "sub", "-t", "OneShot", "-ssl", "language=English|French",
             "--count", "1"),
        _env(home),
    )  # fmt: skip
    try:
        sub.wait_line("Waiting ....")
        rc, out, err = run_joms(home, "--url", a.url, "pub", "-t", "OneShot", "-id", "o1",
                                "-p", "Hello", "-ssl", "language=French")  # fmt: skip
        assert (rc, out.strip(), err) == (
            0,
            "The message o1 has been published to topic OneShot",
            "",
        )
        assert sub.proc.wait(20) == 0
        assert "[1] topic OneShot id o1 language=French: Hello" in sub.lines
    finally:
        if sub.proc.poll() is None:
            sub.proc.kill()
    follow = Follower(joms("--url", b.url, "sub", "-t", "OneShot"), _env(home))
    try:
        follow.wait_line("(Ctrl-C to stop)")
        follow.wait_line("[1] topic OneShot id o1")  # still in the network: DTN semantics
        follow.proc.send_signal(signal.SIGINT)
        assert follow.proc.wait(10) == 130
        assert not any("Traceback" in x for x in follow.lines), follow.lines
    finally:
        if follow.proc.poll() is None:
            follow.proc.kill()
    rc, out, err = run_joms(home, "--url", a.url, "send", "-q", "Nowhere", "-f", "/nonexistent")
    assert rc == 1 and err.strip() == "error: file /nonexistent does not exist"


def test_dash_c_runs_a_script(net: tuple[Host, Host], home: Path) -> None:
    a, _ = net
    rc, out, err = run_joms(
        home, "--url", a.url, "-c",
        "sub -t Script --count 1; pub -t Script -id s1 -p via dash c; subscriptions",
    )  # fmt: skip
    assert rc == 0, err
    assert "[1] topic Script id s1: via dash c" in out.splitlines()
    rc, out, err = run_joms(home, "--url", a.url, "--state-dir", str(a.state_dir), "-c",
                            "status; peers; destinations")  # fmt: skip
    assert rc == 0, err
    assert "host id    ca" in out and "daemon     " + a.url + ": connected" in out
    assert any(line.startswith("cb  127.0.0.1:") for line in out.splitlines()), out
    [topics] = [x for x in out.splitlines() if x.startswith("topics:")]
    assert "Script" in topics.split(":", 1)[1].strip().split(", ")  # from the daemon's cache


def test_ctrl_c_in_a_script_stops_it_with_130(net: tuple[Host, Host], home: Path) -> None:
    """docs/console.md: 130 on Ctrl-C, and a script stops there. A Ctrl-C during a
    script's blocking ``receive`` used to count as one failed command (exit 1) and the
    script went on with the next one."""
    a, _ = net
    script = Follower(
        joms("--url", a.url, "-c",
             "pub -t CtrlCBefore -id c1 -p one; receive -q CtrlCNobody --timeout 60; "
             "pub -t CtrlCAfter -id c2 -p two"),
        _env(home),
    )  # fmt: skip
    try:
        script.wait_line("The message c1 has been published")
        script.proc.send_signal(signal.SIGINT)
        assert script.proc.wait(10) == 130, script.lines
        assert not any("c2" in x for x in script.lines), script.lines
        assert not any("Traceback" in x for x in script.lines), script.lines
    finally:
        if script.proc.poll() is None:
            script.proc.kill()


def test_a_queue_message_received_once_is_not_received_again(
    net: tuple[Host, Host], home: Path
) -> None:
    """Issue 17, defect 1, as the console showed it on the queue manager's host:
    ``receive -q MailBox1; receive -q MailBox1`` printed ``m1`` then ``m1 (redelivered)``
    (the first receiver's close went out at once, its ack waited in the ack batch)."""
    a, _ = net
    rc, out, err = run_joms(home, "--url", a.url, "-c",
                            "send -q MailBox1 -id m1 -p first; receive -q MailBox1 --timeout 10; "
                            "receive -q MailBox1 --timeout 1")  # fmt: skip
    assert [x for x in out.splitlines() if x.startswith("queue ")] == [
        "queue MailBox1@ca id m1: first"
    ], out
    assert (rc, err.strip()) == (1, "error: no message on queue MailBox1 within 1 s")


def test_a_queue_hands_out_only_what_the_pattern_matches(
    net: tuple[Host, Host], home: Path
) -> None:
    """``-ssl k=Chat.*`` on a queue: RE2's ``.`` skips line feeds, LIKE's ``%`` does not, so
    a value with a line feed must stay on the queue (it was handed out before the clause
    excluded line feeds)."""
    a, _ = net
    with jms.connect(f"stomp://{a.url}") as conn:
        s = conn.create_session()
        producer = s.create_producer(jms.Queue("Lines"))
        producer.send(s.create_text_message("two lines", properties={"k": "Chat\nroom"}))
        producer.send(s.create_text_message("one line", properties={"k": "Chatroom"}))
    rc, out, err = run_joms(home, "--url", a.url, "-c",
                            "receive -q Lines -ssl k=Chat.* --timeout 10; "
                            "receive -q Lines -ssl k=Chat.* --timeout 1")  # fmt: skip
    got = [x for x in out.splitlines() if x.startswith("queue ")]
    assert len(got) == 1 and got[0].endswith(" k=Chatroom: one line"), out
    assert (rc, err.strip()) == (1, "error: no message on queue Lines within 1 s"), err
    rc, out, err = run_joms(home, "--url", a.url, "receive", "-q", "Lines", "--timeout", "10")
    assert rc == 0 and "two lines" in out, (out, err)  # still there, for a plain receiver


def test_a_general_regex_is_checked_by_the_console(net: tuple[Host, Host], home: Path) -> None:
    a, _ = net
    rc, out, err = run_joms(
        home, "--url", a.url, "-c",
        "sub -t Rx -ssl n=[0-9]+ --count 1; pub -t Rx -id bad -p no -ssl n=4x; "
        "pub -t Rx -id good -p yes -ssl n=42",
    )  # fmt: skip
    assert rc == 0, err
    assert "selector:" not in out  # nothing could be pushed to the network
    assert "[1] topic Rx id good n=42: yes" in out.splitlines()
    assert "id bad" not in out


def test_durable_subscription_by_client_id(net: tuple[Host, Host], home: Path) -> None:
    a, _ = net
    rc, out, err = run_joms(
        home, "--url", a.url, "--client-id", "alice", "-c",
        "sub -t Dur --durable keep --count 1; pub -t Dur -id d1 -p kept; subscriptions",
    )  # fmt: skip
    assert rc == 0, err
    assert "[1] subscribed to topic Dur, durable keep, until 1 message" in out
    assert "[1] topic Dur id d1: kept" in out.splitlines()
    rc, out, err = run_joms(home, "--url", a.url, "--client-id", "alice", "-c",
                            "unsub --durable keep")  # fmt: skip
    assert (rc, out.strip()) == (0, "durable subscription keep deleted"), err


def test_commands_piped_on_stdin(net: tuple[Host, Host], home: Path) -> None:
    a, b = net
    rc, out, err = run_joms(home, "--url", b.url, input="create queue Box\n")
    assert rc == 0 and "queue Box created, managed by this host" in out, err
    rc, out, err = run_joms(home, "--url", a.url, "send", "-q", "Box@cb", "-id", "q1", "-p",
                            "queued")  # fmt: skip
    assert rc == 0, err
    script = "# a comment line\nreceive -q Box --timeout 15\nbogus\ndestinations\nexit\nstatus\n"
    rc, out, err = run_joms(home, "--url", b.url, input=script)
    assert rc == 1  # `bogus` failed; the others ran
    assert "queue Box@cb id q1: queued" in out.splitlines()
    assert "error: unknown command 'bogus'" in err
    assert "queues:  Box" in out
    assert "daemon     " not in out  # nothing after exit


def test_ctrl_c_reaches_a_command_even_where_the_suite_ignores_sigint() -> None:
    """The suite may run with SIGINT ignored (a background job of a non-interactive shell):
    ``foreground`` gives the commands it stops with Ctrl-C the default disposition back."""
    code = "import signal, time; print(repr(signal.getsignal(signal.SIGINT)), flush=True); time.sleep(30)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as such a suite inherits it
    try:
        ignored = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        restored = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=foreground
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert ignored.stdout is not None and restored.stdout is not None
        assert ignored.stdout.readline().strip() == repr(signal.SIG_IGN)
        assert "default_int_handler" in restored.stdout.readline()
        restored.send_signal(signal.SIGINT)
        assert restored.wait(10) != 0  # KeyboardInterrupt ended it
    finally:
        for p in (ignored, restored):
            p.kill()
            p.wait()


# ---------------------------------------------------------------- stdout's reader gone


def _read_lines_then_close(
    args: list[str], env: dict[str, str], lines: int, kind: str = "pipe"
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``args`` with stdout a pipe (or a socket: no POLLERR, only EPIPE on write), read
    ``lines`` lines from it as ``head`` would, then close the reading end."""
    if kind == "pipe":
        reader_fd, writer_fd = os.pipe()
        reader = os.fdopen(reader_fd, "rb")
    else:
        near, far = socket.socketpair()
        reader, writer_fd = near.makefile("rb"), far.detach()
        near.close()  # (the makefile keeps it open until closed)
    proc = subprocess.Popen(args, stdout=writer_fd, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    os.close(writer_fd)
    got: list[str] = []
    done = threading.Event()

    def read() -> None:
        for _ in range(lines):
            line = reader.readline()
            if not line:
                break
            got.append(line.decode().rstrip("\n"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(20):
        proc.kill()
        pytest.fail(f"{args}: fewer than {lines} lines: {got}")
    reader.close()
    return proc, got


def _finished(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{proc.args}: still running {timeout} s after its reader went away")
    assert proc.stderr is not None
    return rc, proc.stderr.read().decode()


def test_a_subscriber_piped_to_head_stops_quietly(net: tuple[Host, Host], home: Path) -> None:
    """``joms sub -t T --count 5 | head -1`` never ended (each arrival: a BrokenPipeError
    traceback, not counted); ``sub | head -2`` ended with a traceback and 1; a long ``-c``
    script ran to its end with one ``unexpected BrokenPipeError`` per command."""
    a, b = net
    rc, _, err = run_joms(home, "--url", a.url, "-c",
                          "; ".join(f"pub -t PipeT -id p{i} -p line {i}" for i in range(6)))  # fmt: skip
    assert rc == 0, err
    for args, lines in [
        (["sub", "-t", "PipeT", "--count", "5"], 1),
        (["sub", "-t", "PipeT"], 2),
        (["sub", "-t", "PipeT"], 5),  # one arrival read, the others fail
        (["-c", "help; " * 500], 1),
    ]:
        proc, got = _read_lines_then_close(joms("--url", b.url, *args), _env(home), lines)
        rc, err = _finished(proc)
        assert (rc, err) == (141, ""), (args, got)


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_a_queue_message_a_dead_output_could_not_show_stays_on_the_queue(
    net: tuple[Host, Host], home: Path, kind: str
) -> None:
    """A subscriber acknowledges a message once printed: one whose output died takes nothing
    off the queue (it was acknowledged as it arrived, then lost to the broken pipe). Through
    a socket the loss is seen only when a write fails (no POLLERR before)."""
    a, _ = net
    queue = f"PipeQ{kind}"
    rc, _, err = run_joms(home, "--url", a.url, "create", "queue", queue)
    assert rc == 0, err
    proc, got = _read_lines_then_close(
        joms("--url", a.url, "sub", "-q", queue), _env(home), 2, kind
    )
    assert got[1] == "Waiting ....", got
    rc, _, err = run_joms(home, "--url", a.url, "send", "-q", queue, "-id", "kept", "-p", "x")
    assert rc == 0, err
    rc, err = _finished(proc)
    assert (rc, err) == (141, "")
    rc, out, err = run_joms(home, "--url", a.url, "receive", "-q", queue, "--timeout", "10")
    assert rc == 0 and f"queue {queue}@ca id kept: x" in out, (out, err)


def test_dodwan_follow_piped_to_head_stops_quietly_with_141(
    net: tuple[Host, Host], home: Path
) -> None:
    """The ``dodwan`` CLI alike: ``subscribe --follow | head`` ends quietly, 141."""
    a, b = net
    dodwan = [sys.executable, "-m", "dodwan.cli", "--state-dir"]
    for i in range(3):
        p = subprocess.run([*dodwan, str(a.state_dir), "publish", "-a", "kind=headpipe",
                            "-a", f"n={i}", "--text", f"hello {i}"],
                           capture_output=True, text=True, env=_env(home), cwd=ROOT)  # fmt: skip
        assert p.returncode == 0, p.stderr
    proc, got = _read_lines_then_close(
        [*dodwan, str(b.state_dir), "subscribe", "-p", "kind=headpipe", "--follow"],
        _env(home),
        2,
    )
    assert got[1].startswith("--- ca-"), got
    # docs/admin-api.md: it ends at its next write after the reader went away (what it had
    # written may all have fit in the pipe before the reader closed): one more message
    p = subprocess.run([*dodwan, str(a.state_dir), "publish", "-a", "kind=headpipe",
                        "-a", "n=3", "--text", "hello 3"],
                       capture_output=True, text=True, env=_env(home), cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr
    rc, err = _finished(proc, timeout=30.0)
    assert (rc, err) == (141, "")


# ---------------------------------------------------------------- refused, lost or unknown


def test_a_hung_daemon_is_an_unknown_outcome_not_a_refusal(tmp_path: Path, home: Path) -> None:
    """SIGSTOP: ``pub`` got no receipt and printed ``the daemon refused: no receipt for
    SEND``, yet the message was published once the daemon resumed: whoever sent it again
    made a duplicate. The console now says the outcome is unknown."""
    host = Host(tmp_path, "ch", random_group()).start()
    sub = Follower(joms("--url", host.url, "sub", "-t", "Hung", "--count", "1"), _env(home))
    script = None
    try:
        sub.wait_line("Waiting ....")
        script = Follower(joms("--url", host.url), _env(home), stdin=subprocess.PIPE)
        assert script.proc.stdin is not None
        script.proc.stdin.write("pub -t Hung -id h0 -p warm\n")
        script.proc.stdin.flush()
        script.wait_line("The message h0 has been published")
        # (the sub's count is 1 and h0 came first: it ends with h0; h1 is checked below)
        assert host.daemon.proc is not None
        os.kill(host.daemon.proc.pid, signal.SIGSTOP)
        try:
            script.proc.stdin.write("pub -t Hung -id h1 -p stuck\n")
            script.proc.stdin.close()
            line = script.wait_line("error: ", timeout=20)
        finally:
            os.kill(host.daemon.proc.pid, signal.SIGCONT)
        assert script.proc.wait(20) == 1
        assert "refused" not in line, line
        assert line.startswith("error: no answer from the daemon within 5 s"), line
        assert "may or may not have been published" in line, line
        # it was published after all: what the message said was right to say
        rc, out, err = run_joms(home, "--url", host.url, "sub", "-t", "Hung", "-sel",
                                "label = 'h1'", "--count", "1", timeout=30)  # fmt: skip
        assert rc == 0 and "[1] topic Hung id h1: stuck" in out, (out, err)
    finally:
        for f in (sub, script):
            if f is not None and f.proc.poll() is None:
                f.proc.kill()
        host.daemon.kill()


def test_a_daemon_killed_during_receive_is_a_loss_not_a_refusal(tmp_path: Path, home: Path) -> None:
    """``kill -9`` under ``receive`` printed ``! connection … lost`` and then
    ``error: the daemon refused: connection closed: …``."""
    host = Host(tmp_path, "ck", random_group()).start()
    script = Follower(
        joms("--url", host.url, "-c", "create queue Lost; receive -q Lost --timeout 30"),
        _env(home),
    )
    try:
        script.wait_line("queue Lost created")
        host.daemon.kill(signal.SIGKILL)
        line = script.wait_line("error: ")
        assert script.proc.wait(20) == 1
        assert "refused" not in line, script.lines
        assert line.startswith("error: connection to the daemon lost ("), script.lines
    finally:
        if script.proc.poll() is None:
            script.proc.kill()
        host.daemon.kill()


# ---------------------------------------------------------------- several lines at once


@needs_tmux
def test_pasted_lines_are_several_commands(
    net: tuple[Host, Host], tmux: Callable[..., Pane]
) -> None:
    """Two lines pasted at the prompt (bracketed paste) ran as one command: argparse kept
    the last ``-t``/``-id``/``-p``, and the first message was silently never published."""
    a, _ = net
    pane = tmux("--url", a.url)
    pane.line("sub -t Pasted --count 2")
    pane.wait("Waiting ....")
    lines = "pub -t Pasted -id p1 -p first\npub -t Pasted -id p2 -p second"
    subprocess.run([*pane.base, "set-buffer", "-b", "paste", lines], check=True)
    subprocess.run([*pane.base, "paste-buffer", "-p", "-b", "paste", "-t", pane.name], check=True)
    pane.keys("Enter")
    screen = pane.wait("subscription 1 got its 2 messages")
    assert _lines_with(screen, "[1] topic Pasted id p1: first"), screen
    assert _lines_with(screen, "[1] topic Pasted id p2: second"), screen


def test_a_line_feed_in_dash_c_separates_commands(net: tuple[Host, Host], home: Path) -> None:
    a, _ = net
    rc, out, err = run_joms(home, "--url", a.url, "-c",
                            "sub -t NewLine --count 2; pub -t NewLine -id n1 -p first\n"
                            "pub -t NewLine -id n2 -p second # a comment\nsubscriptions")  # fmt: skip
    assert rc == 0, err
    lines = out.splitlines()
    assert "[1] topic NewLine id n1: first" in lines and "[1] topic NewLine id n2: second" in lines
    rc, out, err = run_joms(home, "--url", a.url, "pub", "-t", "Twice", "-p", "x", "-t", "Other")
    assert rc == 2 and "error: argument -t: given twice: give it once" in err, (out, err)


# ---------------------------------------------------------------- -f FILE


def _limit_memory() -> None:
    """``preexec_fn``: 2 GiB of address space, so that a reader without a bound fails
    instead of eating the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_dash_f_reads_at_most_16_mib_of_any_file(
    net: tuple[Host, Host], home: Path, tmp_path: Path
) -> None:
    """``pub -t Z -f /dev/zero`` grew to gigabytes: the 16 MiB check read ``st_size``, 0 for
    a device or a pipe. Now any file is read up to one byte more than the limit."""
    a, _ = net
    big = tmp_path / "big.dat"
    with big.open("wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)
    exact = tmp_path / "exact.dat"
    with exact.open("wb") as f:
        f.truncate(16 * 1024 * 1024)
    for path in ("/dev/zero", str(big)):
        p = subprocess.run(joms("--url", a.url, "pub", "-t", "Zero", "-f", path),
                           capture_output=True, text=True, timeout=60, env=_env(home), cwd=ROOT,
                           preexec_fn=_limit_memory)  # fmt: skip
        assert (p.returncode, p.stderr.strip()) == (
            1,
            f"error: {path} holds more than 16 MiB: a message takes at most that",
        ), p.stdout
    p = subprocess.run(joms("--url", a.url, "-c", f"pub -t Zero -id exact -f {exact}"),
                       capture_output=True, text=True, timeout=60, env=_env(home), cwd=ROOT)  # fmt: skip
    assert "16 MiB" not in p.stderr, p.stderr  # the limit itself is allowed
