"""The console as a new user meets it (issue 19): finding the STOMP gateway from the state
directory, saying clearly what is wrong, and wording its output right.

Real daemons on loopback; the console in tmux panes (interactive) and as one-shot
processes, as in ``test_console_terminal.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_console_terminal import Host, Pane, _free_port, home, needs_tmux, run_joms, tmux
from test_daemon_helpers import DaemonProc, random_group

__all__ = ["home", "tmux"]  # fixtures used here


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, DaemonProc]]:
    """One daemon with a STOMP gateway, one without."""
    root = tmp_path_factory.mktemp("console-gw")
    group = random_group()
    with_gw = Host(root, "gw", group)
    without = DaemonProc(root / "nogw", ["--host-id", "nogw", "--group", group])
    try:
        with_gw.start()
        without.start()
        yield with_gw, without
    finally:
        with_gw.daemon.kill()
        without.kill()


# ---------------------------------------------------------------- 2. the gateway


def test_admin_json_and_the_start_up_log_name_the_gateway(hosts: tuple[Host, DaemonProc]) -> None:
    gw, nogw = hosts
    info = json.loads((gw.state_dir / "admin.json").read_text())
    assert info["stomp"] == gw.url
    assert f"JOMS STOMP gateway stomp://{gw.url}" in gw.daemon.log.read_text()
    assert json.loads((nogw.state_dir / "admin.json").read_text())["stomp"] is None
    assert "no STOMP gateway (start with --stomp" in nogw.log.read_text()


def test_state_dir_is_enough_to_find_the_gateway(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane], home: Path
) -> None:
    gw, _ = hosts
    rc, out, err = run_joms(home, "--state-dir", str(gw.state_dir), "status")
    assert rc == 0, err
    assert f"daemon     stomp://{gw.url}: connected" in out.splitlines()
    for row in out.splitlines():  # aligned: every value starts in column 12
        assert row[10] == " " and row[11] != " ", out
    assert "client id  (none), 0 subscriptions in this console" in out.splitlines()
    pane = tmux("--state-dir", str(gw.state_dir))
    pane.wait(f"JOMS console, connected to stomp://{gw.url}.")
    pane.line("pub -t Found -id f1 -p via the state dir")
    pane.wait("The message f1 has been published to topic Found")


def test_a_daemon_without_a_gateway_is_named_as_such(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane], home: Path
) -> None:
    _, nogw = hosts
    rc, out, err = run_joms(home, "--state-dir", str(nogw.state_dir), "status")
    assert rc == 1, out
    assert "serves no STOMP gateway" in err and "--stomp" in err, err
    assert "host id    nogw" in out  # the daemon itself is up, and status says so
    rc, out, err = run_joms(home, "--state-dir", str(nogw.state_dir), "pub", "-t", "T", "-p", "x")
    assert rc == 1
    assert "serves no STOMP gateway" in err and "cannot reach" not in err, err
    pane = tmux("--state-dir", str(nogw.state_dir))
    screen = pane.wait("serves no STOMP gateway")
    assert "cannot reach" not in screen


def test_a_wrong_url_is_explained_by_the_state_dir(
    hosts: tuple[Host, DaemonProc], home: Path
) -> None:
    gw, nogw = hosts
    wrong = f"127.0.0.1:{_free_port()}"
    rc, _, err = run_joms(home, "--url", wrong, "--state-dir", str(nogw.state_dir), "status")
    assert rc == 1
    assert f"cannot reach the daemon at {wrong}" in err and "serves no STOMP gateway" in err, err
    rc, _, err = run_joms(home, "--url", wrong, "--state-dir", str(gw.state_dir), "status")
    assert rc == 1
    assert f"the daemon of {gw.state_dir} serves stomp://{gw.url}" in err, err


def test_a_client_id_in_use_is_a_refusal_not_an_unreachable_daemon(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane], home: Path
) -> None:
    gw, _ = hosts
    first = tmux("--url", gw.url, "--client-id", "bob")
    first.line("status")
    first.wait(f"daemon     {gw.url}: connected")
    rc, _, err = run_joms(home, "--url", gw.url, "--client-id", "bob", "pub", "-t", "T", "-p", "x")
    assert rc == 1
    assert "cannot reach" not in err, err
    assert f"the daemon at {gw.url} refused the connection" in err, err
    assert "client id 'bob' is already connected" in err, err


def test_a_malformed_url_is_a_clear_error(home: Path) -> None:
    rc, _, err = run_joms(home, "--url", "bogus:url:x", "status")
    assert rc == 2
    assert "unexpected" not in err and "Traceback" not in err, err
    assert err.startswith("error: bad --url 'bogus:url:x'"), err


# ---------------------------------------------------------------- 4. wording


@needs_tmux
def test_unsub_of_a_durable_subscription_says_it_is_kept(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane]
) -> None:
    gw, _ = hosts
    pane = tmux("--url", gw.url, "--client-id", "alice")
    pane.line("sub -t Keep --durable mine")
    pane.wait("[1] subscribed to topic Keep, durable mine")
    pane.line("unsub 1")
    screen = pane.wait("deletes it)")
    assert "unsubscribed from" not in screen
    assert "the daemon keeps durable subscription mine" in screen
    pane.line("unsub --durable mine")
    pane.wait("durable subscription mine deleted")


@needs_tmux
def test_a_refused_sub_does_not_use_up_a_number(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane]
) -> None:
    gw, _ = hosts
    pane = tmux("--url", gw.url)
    pane.line("sub -t Bad -sel 'a >'")
    pane.wait("error: the daemon refused")
    pane.line("sub -t Good")
    screen = pane.wait("subscribed to topic Good")
    assert "[1] subscribed to topic Good" in screen, screen


@needs_tmux
def test_counts_are_pluralised_and_sizes_have_units(
    hosts: tuple[Host, DaemonProc], tmux: Callable[..., Pane]
) -> None:
    gw, _ = hosts
    pane = tmux("--url", gw.url, "--state-dir", str(gw.state_dir))
    pane.line("sub -t Once --count 1")
    pane.wait("[1] subscribed to topic Once, until 1 message")
    pane.line("pub -t Once -p one")
    screen = pane.wait("subscription 1 got its 1 message")
    assert "message(s)" not in screen and "1 messages" not in screen
    pane.line("status")
    screen = pane.wait(lambda s: any(x.startswith("cache      ") for x in s.splitlines()))
    [cache] = [x for x in screen.splitlines() if x.startswith("cache      ")]
    assert cache.endswith("MiB") and " of " in cache, cache  # not raw byte counts


# ---------------------------------------------------------------- 5. -ssl on queues


def test_ssl_on_a_queue_never_consumes_what_it_does_not_show(
    hosts: tuple[Host, DaemonProc], home: Path
) -> None:
    gw, _ = hosts
    rc, _, err = run_joms(
        home,
        "--url",
        gw.url,
        "-c",
        "send -q SslQ -p first -ssl n=ab; send -q SslQ -p second -ssl n=5",
    )
    assert rc == 0, err
    # a pattern the service cannot apply before handing out: refused, nothing taken
    for cmd in ("receive -q SslQ -ssl n=[0-9]+ --timeout 2", "sub -q SslQ -ssl n=[0-9]+ --count 1"):
        rc, out, err = run_joms(home, "--url", gw.url, *cmd.split())
        assert rc == 1, out + err
        assert "-sel" in err and "n=[0-9]+" in err, err
    # a pattern with an exact selector clause: filtered by the queue's manager
    rc, out, err = run_joms(home, "--url", gw.url, "receive", "-q", "SslQ", "-ssl", "n=5|6")
    assert rc == 0 and out.rstrip().endswith(": second"), out + err
    rc, out, err = run_joms(home, "--url", gw.url, "receive", "-q", "SslQ", "--timeout", "5")
    assert rc == 0 and out.rstrip().endswith(": first"), out + err
