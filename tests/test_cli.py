"""The ``dodwan`` command line: every command's success and error paths, and ``--help``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.cli import cli


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, cmd in group.commands.items():
        yield (*prefix, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


ALL = list(_commands(cli))


def run(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def _one_error_line(r: Result, needle: str) -> None:
    assert r.exit_code != 0
    assert "Traceback" not in r.output
    lines = [x for x in r.output.splitlines() if x.startswith("Error")]
    assert len(lines) == 1 and needle in lines[0], r.output


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(
        tmp_path_factory.mktemp("cli") / "state",
        ["--group", random_group(), "--host-id", "clihost", "--announce-period", "0.5"],
    )
    d.start()
    yield d
    d.kill()


@pytest.fixture
def sd(daemon: DaemonProc) -> str:
    return str(daemon.state_dir)


# ---------------------------------------------------------------------- help


def test_every_command_is_listed() -> None:
    names = {" ".join(c) for c in ALL}
    expected = {
        "daemon", "status", "peers", "profile", "publish", "subscribe", "unsubscribe",
        "subscriptions", "cache", "cache ls", "cache show", "cache purge", "keygen", "top",
        "check", "repair",
        "bridge", "bridge add", "bridge rm", "bridge ls",
    }  # fmt: skip
    assert names == expected  # a new command is added here, and so to the error-path tests


@pytest.mark.parametrize("command", [(), *ALL], ids=lambda c: " ".join(c) or "dodwan")
def test_help_on_every_command(command: tuple[str, ...]) -> None:
    r = run(*command, "--help")
    assert r.exit_code == 0
    assert "Usage:" in r.output and (command[-1] if command else "dodwan") in r.output


def test_daemon_help_lists_every_setting() -> None:
    from dodwan.daemon.config import NODE_FIELDS, SETTINGS

    out = run("daemon", "--help").output
    for s in SETTINGS:
        if s.name == "bridges":  # tables ([[bridges]]): config file and `dodwan bridge add`
            continue
        assert f"--{s.name.replace('_', '-')}" in out
    for name in NODE_FIELDS:
        assert f"--{name.replace('_', '-')}" in out


# ---------------------------------------------------------------------- no daemon


CLIENT_COMMANDS = [
    ["status"],
    ["peers"],
    ["profile"],
    ["subscriptions"],
    ["publish", "-a", "k=v", "--text", "x"],
    ["subscribe", "-p", "a=b", "--follow"],
    ["unsubscribe", "k"],
    ["cache", "ls"],
    ["cache", "show", "id"],
    ["cache", "purge", "id"],
    ["bridge", "add", "mqtt://127.0.0.1/x/#", "--attr", "a=b"],
    ["bridge", "rm", "x"],
    ["bridge", "ls"],
]


@pytest.mark.parametrize("args", CLIENT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_unknown_daemon_is_one_line(tmp_path: Path, args: list[str]) -> None:
    r = run("--state-dir", str(tmp_path / "nothing"), *args)
    _one_error_line(r, "no daemon running")


def test_stale_admin_file_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "admin.json").write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": 1}))
    _one_error_line(run("--state-dir", str(tmp_path), "status"), "not reachable")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--group", "not-an-address"], "bad address"),
        (["--group", "10.0.0.1"], "expected HOST:PORT"),
        (["--admin", "localhost:http"], "port must be a number"),
        (["--config", "/nonexistent/dodwan.toml"], "does not exist"),
        (["--horizon", "0"], "horizon"),
        (["--admin", "0.0.0.0:8080"], "not a loopback address"),
    ],
)
def test_daemon_refuses_bad_settings(tmp_path: Path, args: list[str], needle: str) -> None:
    _one_error_line(run("daemon", "--state-dir", str(tmp_path), *args), needle)


def test_a_state_directory_that_is_a_file_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said '...: File exists' (mkdir's error), which reads like a clash, not a mistake."""
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("DODWAN_STATE_DIR", str(f))
    _one_error_line(
        run("daemon", "--group", random_group()), f"state directory {f} is not a directory"
    )
    r = run("daemon", "--state-dir", str(f / "sub"), "--group", random_group())
    _one_error_line(r, f"cannot use state directory {f / 'sub'}: {f} is not a directory")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--horizon", "٣"),  # int("٣") is 3
        ("--horizon", "1_0"),  # int("1_0") is 10
        ("--bitrate", "２000"),
        ("--exec-timeout", "6_0"),
        ("--exec-timeout", "٣.5"),
        ("--announce-period", " 5"),
    ],
)
def test_daemon_numbers_are_written_with_ascii_digits(
    tmp_path: Path, option: str, value: str
) -> None:
    """The config file (TOML) only takes ASCII digits; the options took whatever Python's
    int() and float() read. The missing config file stops the daemon either way: before
    the fix that was the error, now the option is refused first."""
    conf = str(tmp_path / "none.toml")
    r = run("daemon", "--state-dir", str(tmp_path), "--config", conf, option, value)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"Invalid value for '{option}'" in r.output and repr(value) in r.output, r.output


@pytest.mark.parametrize(
    "args",
    [
        ["publish", "-a", "topic=x", "--text", "t", "--ttl", "٣"],
        ["publish", "-a", "topic=x", "--text", "t", "--ttl", "1_0"],
        ["bridge", "add", "stomp://127.0.0.1:61613/topic/x", "-a", "topic=x", "--ttl", "6_0"],
        ["bridge", "add", "stomp://127.0.0.1:61613/topic/x", "-a", "topic=x", "--holdoff", "٣"],
    ],
)
def test_other_number_options_are_written_with_ascii_digits(
    tmp_path: Path, args: list[str]
) -> None:
    """As the daemon's options: refused by the CLI, before any daemon is asked (none runs)."""
    r = run("--state-dir", str(tmp_path), *args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "ASCII digits" in r.output and repr(args[-1]) in r.output, r.output


@pytest.mark.parametrize(
    ("args", "key", "value"),
    [
        (["--horizon", "3"], "horizon", 3),
        (["--horizon", "+3"], "horizon", 3),
        (["--exec-timeout", "1e1"], "exec_timeout", 10.0),
        (["--exec-timeout", ".5"], "exec_timeout", 0.5),
        (["--bitrate", "2000000"], "bitrate", 2000000),
    ],
)
def test_daemon_number_options_still_take_plain_numbers(
    args: list[str], key: str, value: float
) -> None:
    from dodwan.cli import daemon

    ctx = daemon.make_context("daemon", args)
    assert ctx.params[key] == value and type(ctx.params[key]) is type(value)


# ---------------------------------------------------------------------- with a daemon


def test_status_human_and_json(sd: str) -> None:
    r = run("--state-dir", sd, "status")
    assert r.exit_code == 0 and "clihost" in r.output and "multicast4" in r.output
    js = json.loads(run("--state-dir", sd, "status", "--json").output)
    assert js["host_id"] == "clihost" and js["uptime"] >= 0 and "counters" in js
    rm = js["remote_memory"]
    assert rm["budget"] == 64 << 20 and 0 <= rm["bytes"] <= rm["budget"]
    assert "peer state" in r.output and "of 64.0 MiB" in r.output
    # --state-dir is also accepted after the command name
    assert json.loads(run("status", "--state-dir", sd, "--json").output)["host_id"] == "clihost"


def test_peers_and_profile(sd: str) -> None:
    r = run("--state-dir", sd, "peers")
    assert r.exit_code == 0 and r.output.strip() == "no neighbours"  # alone on its group
    assert json.loads(run("--state-dir", sd, "peers", "--json").output) == {}
    sub = run("--state-dir", sd, "subscribe", "-p", "topic=prof.*", "--dir", str(Path(sd) / "p"),
              "--key", "prof")  # fmt: skip
    assert sub.exit_code == 0 and sub.output.strip() == "prof"
    r = run("--state-dir", sd, "profile")
    assert r.exit_code == 0 and "prof.*" in r.output
    js = json.loads(run("--state-dir", sd, "profile", "--json").output)
    assert {"topic": "prof.*"} in js["own"]
    assert run("--state-dir", sd, "unsubscribe", "prof").exit_code == 0


def test_peers_table_names_each_neighbour(
    daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", "pa", "--announce-period", "0.5")
    b = daemons("b", "--group", group, "--host-id", "pb", "--announce-period", "0.5",
                "--altruistic")  # fmt: skip
    b.client().post(
        "/subscribe",
        {"patterns": [{"topic": "x"}], "sink": {"kind": "dir", "target": str(tmp_path / "o")}},
    )
    wait_for(lambda: a.client().get("/peers").get("pb", {}).get("patterns"), what="a hears pb")
    js = json.loads(run("--state-dir", str(a.state_dir), "peers", "--json").output)
    assert list(js) == ["pb"] and js["pb"]["altruistic"] is True
    r = run("--state-dir", str(a.state_dir), "peers")
    assert r.exit_code == 0
    header, row = r.output.splitlines()[:2]
    assert header.split() == ["HOST", "ADDRESS", "SILENT", "ALTRUISTIC", "PROFILE"]
    assert row.split()[0] == "pb" and "yes" in row.split() and '{"topic": "x"}' in row


def test_publish_text_file_and_cache_commands(sd: str, tmp_path: Path) -> None:
    r = run("--state-dir", sd, "publish", "-a", "topic=cli", "--text", "hello", "--ttl", "60",
            "--priority", "7", "--no-persistent")  # fmt: skip
    assert r.exit_code == 0
    mid = r.output.strip()
    assert mid.startswith("clihost-")
    f = tmp_path / "payload.bin"
    f.write_bytes(bytes(range(256)) * 10)
    mid2 = run("--state-dir", sd, "publish", "-a", "topic=cli", "--file", str(f)).output.strip()
    ls = run("--state-dir", sd, "cache", "ls")
    assert ls.exit_code == 0 and mid in ls.output and mid2 in ls.output
    assert "published here" in ls.output
    items = {m["id"]: m for m in json.loads(run("--state-dir", sd, "cache", "ls", "--json").output)}
    assert items[mid]["priority"] == 7 and items[mid]["persistent"] is False
    assert items[mid2]["size"] == 2560 and items[mid2]["complete"] is True
    show = run("--state-dir", sd, "cache", "show", mid, "--payload")
    assert show.exit_code == 0 and "hello" in show.output and "topic: cli" in show.output
    assert "binary payload" in run("--state-dir", sd, "cache", "show", mid2, "--payload").output
    assert run("--state-dir", sd, "cache", "purge", mid).exit_code == 0
    assert mid not in run("--state-dir", sd, "cache", "ls").output
    _one_error_line(run("--state-dir", sd, "cache", "show", mid), "no cached message")
    _one_error_line(run("--state-dir", sd, "cache", "purge", mid), "no cached message")


def test_publish_from_stdin_and_chosen_id(sd: str) -> None:
    r = run("--state-dir", sd, "publish", "--id", "my-own-id", "-a", "k=v", "--file", "-",
            input=b"from stdin")  # fmt: skip
    assert r.exit_code == 0 and r.output.strip() == "my-own-id"
    _one_error_line(
        run("--state-dir", sd, "publish", "--id", "my-own-id", "-a", "k=v", "--text", "again"),
        "already known",
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--file", "/nonexistent/file"], "does not exist"),
        (["--text", "a", "--file", "/etc/hostname"], "exactly one of --text or --file"),
        ([], "exactly one of --text or --file"),
        (["-a", "novalue", "--text", "x"], "expected NAME=VALUE"),
        (["-a", "id=x y", "--text", "x"], "message id"),
        (["-a", "origin=me", "--text", "x"], "set by DoDWAN"),
        (["--ttl", "-5", "--text", "x"], "--ttl must be a positive, finite number"),
        (["--ttl", "inf", "--text", "x"], "--ttl must be a positive, finite number"),
        (["--ttl", "nan", "--text", "x"], "--ttl must be a positive, finite number"),
        (["--id", "only-an-id", "--text", "x"], "give at least one attribute"),
    ],
)
def test_publish_errors(sd: str, args: list[str], needle: str) -> None:
    _one_error_line(run("--state-dir", sd, "publish", *args), needle)


def test_subscribe_dir_exec_list_and_unsubscribe(sd: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run("--state-dir", sd, "subscribe", "-p", "topic=sub.*", "--dir", str(out), "--key", "d1")
    assert r.exit_code == 0 and r.output.strip() == "d1"
    log = tmp_path / "exec.log"
    r = run("--state-dir", sd, "subscribe", "-p", "topic=sub.*", "--exec", f"cat >> {log}")
    assert r.exit_code == 0
    k2 = r.output.strip()
    mid = run(
        "--state-dir", sd, "publish", "-a", "topic=sub.a", "--text", "payload!"
    ).output.strip()
    wait_for(lambda: (out / f"{mid}.json").exists(), what="dir delivery")
    assert (out / mid).read_text() == "payload!"
    wait_for(lambda: log.exists() and log.read_text() == "payload!", what="exec delivery")
    listing = run("--state-dir", sd, "subscriptions")
    assert "d1" in listing.output and k2 in listing.output and str(out) in listing.output
    js = {s["key"]: s for s in json.loads(run("--state-dir", sd, "subscriptions", "--json").output)}
    assert js["d1"]["sink"] == {"kind": "dir", "target": str(out)}
    assert js[k2]["patterns"] == [{"topic": "sub.*"}]
    _one_error_line(
        run("--state-dir", sd, "subscribe", "-p", "a=b", "--dir", str(out), "--key", "d1"), "exists"
    )
    assert run("--state-dir", sd, "unsubscribe", "d1").output.strip() == "unsubscribed d1"
    assert run("--state-dir", sd, "unsubscribe", k2).exit_code == 0
    _one_error_line(run("--state-dir", sd, "unsubscribe", "d1"), "no subscription")
    assert "no subscriptions" in run("--state-dir", sd, "subscriptions").output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-p", "topic=(unclosed", "--follow"], "invalid regular expression"),
        (["-p", "topic=(unclosed", "--dir", "/tmp/dodwan-never-created"], "invalid regular"),
        (["-p", "topic=a"], "exactly one of --dir, --exec or --follow"),
        (["-p", "topic=a", "--follow", "--exec", "true"], "exactly one of"),
        (["-p", "noequals", "--follow"], "expected NAME=VALUE"),
        (["-p", "topic=a", "--dir", "/proc/forbidden/x"], "cannot create directory"),
        (["-p", "topic=a", "--follow", "--key", "joms:x"], "reserved"),
    ],
)
def test_subscribe_errors(sd: str, args: list[str], needle: str) -> None:
    _one_error_line(run("--state-dir", sd, "subscribe", *args), needle)


def test_subscribe_follow_streams_until_interrupted(daemon: DaemonProc, sd: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dodwan.cli", "--state-dir", sd, "subscribe", "-p", "topic=fol",
         "--follow", "--json", "--key", "fol"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"subscribed": "fol"}
        mid = run("--state-dir", sd, "publish", "-a", "topic=fol", "--text", "live").output.strip()
        item = json.loads(proc.stdout.readline())
        assert item["descriptor"]["id"] == mid and item["text"] == "live"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    wait_for(
        lambda: "fol" not in {s["key"] for s in daemon.client().get("/subscriptions")},
        what="follow subscription dropped with its client",
    )


def test_admin_file_of_a_dead_process_is_one_line(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    info = {"host": "127.0.0.1", "port": 9, "pid": gone.pid}
    (tmp_path / "admin.json").write_text(json.dumps(info))
    _one_error_line(run("--state-dir", str(tmp_path), "status"), "stale admin.json")


def test_state_dir_from_the_config_file(tmp_path: Path) -> None:
    state = tmp_path / "from-config"
    conf = tmp_path / "c.toml"
    conf.write_text(f'state_dir = "{state}"\ngroup = "{random_group()}"\n')
    d = DaemonProc(tmp_path / "unused", ["--config", str(conf)])
    d.state_dir = state  # where the daemon must put admin.json
    try:
        d.proc = subprocess.Popen(
            [sys.executable, "-m", "dodwan.cli", "daemon", "--config", str(conf)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        d.wait_ready()
        assert run("--state-dir", str(state), "status", "--json").exit_code == 0
        assert (state / "dodwan.db").exists()
    finally:
        d.kill()


# Characters that mean something in a URL, or need encoding in one. Keys may hold anything
# (spaces too); message ids are printable characters without spaces.
ODD = ["q?x=1", "h#frag", "pct%3F", "pct%", "sl/ash", "amp&x", "plus+x", "clé-ü", ".."]


def test_odd_keys_reach_their_own_subscription(sd: str, tmp_path: Path) -> None:
    out = str(tmp_path / "odd")
    plain = {"q", "h", "pct", "sl", "amp", "plus"}  # what a half-read path would name
    keys = [*ODD, "with space"]
    for k in [*plain, *keys]:  # the plain ones are what a half-read path would name
        r = run("--state-dir", sd, "subscribe", "-p", "topic=odd", "--dir", out, "--key", k)
        assert r.exit_code == 0 and r.output.strip() == k, r.output
    for k in keys:
        r = run("--state-dir", sd, "unsubscribe", k)
        assert r.exit_code == 0 and r.output.strip() == f"unsubscribed {k}", r.output
    left = {s["key"] for s in json.loads(run("--state-dir", sd, "subscriptions", "--json").output)}
    assert plain <= left and not left & set(keys), left
    for k in plain:
        assert run("--state-dir", sd, "unsubscribe", k).exit_code == 0
    _one_error_line(run("--state-dir", sd, "bridge", "rm", "b?x"), "no binding 'b?x'")


def test_odd_message_ids_reach_their_own_message(sd: str) -> None:
    plain = ["q", "h", "pct", "sl", "amp", "plus"]
    for mid in [*plain, *ODD]:
        r = run("--state-dir", sd, "publish", "--id", mid, "-a", "topic=odd", "--text", mid)
        assert r.exit_code == 0 and r.output.strip() == mid, r.output
    for mid in ODD:
        show = run("--state-dir", sd, "cache", "show", mid, "--payload")
        assert show.exit_code == 0 and f"id         {mid}\n" in show.output, show.output
        assert show.output.endswith(f"\n{mid}\n")  # its own payload
        r = run("--state-dir", sd, "cache", "purge", mid)
        assert r.exit_code == 0 and r.output.strip() == f"purged {mid}"
    ids = {m["id"] for m in json.loads(run("--state-dir", sd, "cache", "ls", "--json").output)}
    assert set(plain) <= ids and not ids & set(ODD), ids


def test_publish_attributes_too_long_for_a_header_line(sd: str, tmp_path: Path) -> None:
    # 1,500 × 'é' is 9,000 bytes of JSON \u escapes: over the 8 KiB header line of the raw
    # form, while the JSON form takes it; the CLI must publish it all the same.
    value = "é" * 1500
    f = tmp_path / "bin"
    f.write_bytes(bytes(range(256)) * 4)
    for payload in (["--text", "x"], ["--file", str(f)]):
        r = run("--state-dir", sd, "publish", "-a", f"topic={value}", *payload)
        assert r.exit_code == 0, r.output
        mid = r.output.strip()
        shown = json.loads(run("--state-dir", sd, "cache", "show", mid, "--json").output)
        assert shown["descriptor"]["topic"] == value and shown["complete"] is True
        out = tmp_path / "out"
        assert run("--state-dir", sd, "cache", "show", mid, "-o", str(out)).exit_code == 0
        assert out.read_bytes() == (b"x" if payload[0] == "--text" else f.read_bytes())


def test_publish_over_the_descriptor_limit_names_it(sd: str) -> None:
    import secrets

    big = secrets.token_hex(10000)  # 20,000 characters that do not compress below 8 KiB
    r = run("--state-dir", sd, "publish", "-a", f"topic={big}", "--text", "x")
    _one_error_line(r, "max_descriptor_bytes")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["publish", "-a", "topic=news", "-a", "topic=other", "--text", "x"], "'topic'"),
        (["publish", "-a", "id=a", "--id", "b", "-a", "t=x", "--text", "x"], "'id'"),
        (["subscribe", "-p", "topic=a", "-p", "topic=b", "--follow"], "'topic'"),
        (["bridge", "add", "mqtt://127.0.0.1/x/#", "-a", "k=1", "-a", "k=2"], "'k'"),
        (["bridge", "add", "mqtt://127.0.0.1/x/#", "-f", "k=1", "-f", "k=2"], "'k'"),
    ],
)
def test_a_repeated_name_is_a_usage_error(tmp_path: Path, args: list[str], needle: str) -> None:
    # refused before the daemon is asked (none runs here), not the last value kept
    r = run("--state-dir", str(tmp_path), *args)
    assert r.exit_code == 2, r.output
    _one_error_line(r, needle)
    assert "more than once" in r.output


# What a peer may put in attributes and text payloads: clear the screen, retitle the
# terminal, ring the bell; a C1 CSI (U+009B); a newline to forge another attribute line.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b31m\nfake: line"
SHOWN = "\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\x0afake: line"
SHOWN_TEXT = SHOWN.replace("\\x0a", "\n")  # in a text payload


def test_cache_show_escapes_control_characters(sd: str) -> None:
    r = run("--state-dir", sd, "publish", "-a", f"topic={HOSTILE}", "-a", f"x{HOSTILE}=1",
            "--text", f"{HOSTILE}\n\tsecond line")  # fmt: skip
    assert r.exit_code == 0, r.output
    mid = r.output.strip()
    show = run("--state-dir", sd, "cache", "show", mid, "--payload")
    assert show.exit_code == 0
    _no_hidden(show.output)
    assert f"  topic: {SHOWN}\n" in show.output and f"  x{SHOWN}: 1\n" in show.output
    # the payload keeps its line breaks and tabs, nothing else
    assert show.output.endswith(f" bytes)\n{SHOWN_TEXT}\n\tsecond line\n"), show.output
    # JSON stays JSON: the exact strings, escaped by JSON itself
    js = run("--state-dir", sd, "cache", "show", mid, "--json")
    assert json.loads(js.output)["descriptor"]["topic"] == HOSTILE
    _no_hidden(js.output)
    assert run("--state-dir", sd, "cache", "purge", mid).exit_code == 0


# Bidi controls and invisible characters: raw, "abc\u202egnp.exe" reads "abcexe.png" and a
# zero-width space or an isolate hides where one word ends. Readable non-ASCII stays as is.
BIDI = "abc\u202egnp.exe \u2066x\u2069 \u061c\u200e\u200f zero\u200bwidth\ufeff é 日本"
BIDI_SHOWN = (
    "abc\\u202egnp.exe \\u2066x\\u2069 \\u061c\\u200e\\u200f zero\\u200bwidth\\ufeff é 日本"
)


def _no_hidden(text: str) -> None:
    """No control (C0, DEL, C1) nor format character (bidi, zero-width) but \\n and \\t."""
    bad = [c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf")]
    assert not bad, f"hidden characters {bad!r} in {text!r}"


def test_cache_show_escapes_bidi_and_invisible_characters(sd: str) -> None:
    r = run("--state-dir", sd, "publish", "-a", f"topic={BIDI}", "-a", f"x{BIDI}=1",
            "--text", f"{BIDI}\nsecond")  # fmt: skip
    assert r.exit_code == 0, r.output
    mid = r.output.strip()
    show = run("--state-dir", sd, "cache", "show", mid, "--payload")
    assert show.exit_code == 0
    _no_hidden(show.output)
    assert f"  topic: {BIDI_SHOWN}\n" in show.output and f"  x{BIDI_SHOWN}: 1\n" in show.output
    assert show.output.endswith(f" bytes)\n{BIDI_SHOWN}\nsecond\n"), show.output
    assert run("--state-dir", sd, "cache", "purge", mid).exit_code == 0


def test_subscribe_follow_escapes_controls_and_bidi_characters(sd: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dodwan.cli", "--state-dir", sd, "subscribe", "-p",
         "topic=(?s)folbidi.*", "--follow", "--key", "folbidi"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(proc.stdout)

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_for(lambda: lines, what="the follow stream's first line")
        assert lines[0].startswith("subscribed as folbidi"), lines
        r = run("--state-dir", sd, "publish", "-a", f"topic=folbidi{HOSTILE}{BIDI}",
                "--text", f"{HOSTILE}{BIDI}\nend")  # fmt: skip
        mid = r.output.strip()
        wait_for(lambda: "end\n" in lines, what="the delivery's last line")
        text = "".join(lines)
        _no_hidden(text)
        assert f"--- {mid} (folbidi)\n" in lines, lines
        assert f"  topic: folbidi{SHOWN}{BIDI_SHOWN}\n" in lines, lines
        assert f"\n{SHOWN_TEXT}{BIDI_SHOWN}\nend\n" in text, text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_follow_escapes_control_characters(daemon: DaemonProc, sd: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dodwan.cli", "--state-dir", sd, "subscribe", "-p",
         "topic=(?s)esc.*", "--follow", "--key", "esc"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = threading.Timer(20.0, proc.kill)  # a missing line fails, never hangs
    deadline.start()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("subscribed as esc;")
        r = run("--state-dir", sd, "publish", "-a", f"topic=esc{HOSTILE}", "--text",
                f"{HOSTILE}\nEND")  # fmt: skip
        assert r.exit_code == 0, r.output
        lines: list[str] = []
        while not lines or lines[-1] != "END\n":
            line = proc.stdout.readline()
            assert line, f"stream ended early: {lines!r}"
            lines.append(line)
        out = "".join(lines)
        _no_hidden(out)
        assert f"  topic: esc{SHOWN}\n" in out and f"\n{SHOWN_TEXT}\nEND\n" in out
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_empty_state_dir_is_a_usage_error(tmp_path: Path, where: str) -> None:
    args = ["--state-dir", "", "status"] if where == "before" else ["status", "--state-dir", ""]
    r = run(*args)
    assert r.exit_code == 2, r.output
    _one_error_line(r, "--state-dir")
    assert "empty" in r.output


def test_the_daemon_refuses_an_empty_state_dir(tmp_path: Path) -> None:
    # before the fix it ran on the default directory: under this HOME, killed at the deadline
    env = {k: v for k, v in os.environ.items() if k not in ("DODWAN_STATE_DIR", "XDG_STATE_HOME")}
    env["HOME"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dodwan.cli", "daemon", "--state-dir", "", "--group",
         random_group(), "--admin", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the daemon started with --state-dir ''")
    assert proc.returncode == 2 and "--state-dir" in err and "empty" in err, err
    assert not (tmp_path / ".local").exists()


@pytest.mark.parametrize(
    "args",
    [
        # --wait nan passed FloatRange (nan compares false) and then waited forever
        ["--wait", "nan", "status"],
        ["--wait", "inf", "status"],
        # top -n nan passed too, then time.sleep(nan) raised a traceback
        ["top", "-n", "nan", "--once"],
    ],
)
def test_non_finite_numbers_are_refused_before_anything_waits(
    tmp_path: Path, args: list[str]
) -> None:
    r = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), *args])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "'nan' is not a finite number" in r.output or "'inf' is not" in r.output, r.output


def test_an_admin_file_without_the_address_says_what_is_missing(tmp_path: Path) -> None:
    """It said "cannot read …/admin.json: 'host'" (a KeyError's text)."""
    (tmp_path / "admin.json").write_text(json.dumps({"url": "http://127.0.0.1:1/"}))
    _one_error_line(run("--state-dir", str(tmp_path), "status"), "it has no 'host'")
