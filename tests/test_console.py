"""The ``joms`` console's parts without a daemon: grammar, ``-ssl`` mapping, printing,
completion, history, admin discovery. (Real terminals and daemons: test_console_terminal.py.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from console import grammar
from console.admin import NEEDS_STATE_DIR, Admin, AdminUnavailable
from console.cli import main
from console.commands import Console
from console.grammar import Command, HelpRequest, UsageError
from console.interactive import ConsoleCompleter, open_history
from console.link import Link
from console.output import Printer, describe
from console.selection import (
    PatternError,
    accepts,
    combined_selector,
    parse_patterns,
    parse_properties,
    selector_clause,
)
from dodwan.core.patterns import compile_regex
from joms import selector as jms_selector
from joms.api import TextMessage, Topic

# ---------------------------------------------------------------- grammar


def test_the_papers_lines_parse_as_written() -> None:
    pub = grammar.parse_line("pub -t ChatRoom1 -id firstMSG -p Hello -ssl language=English")
    assert isinstance(pub, Command) and pub.name == "pub"
    a = pub.args
    assert (a.topic, a.label, a.text, a.props) == (
        "ChatRoom1",
        "firstMSG",
        ["Hello"],
        ["language=English"],
    )
    sub = grammar.parse_line("sub -t ChatRoom1 -ssl language=English|French")
    assert isinstance(sub, Command) and sub.name == "sub"
    assert (sub.args.topic, sub.args.patterns) == ("ChatRoom1", ["language=English|French"])


def test_publish_options() -> None:
    c = grammar.parse_line(
        "send -q Box@h2 -p meet at noon --non-persistent --priority 7 --ttl 30 "
        "-ssl a=1 b=2 -ssl c=3"
    )
    assert isinstance(c, Command)
    a = c.args
    assert a.queue == "Box@h2" and " ".join(a.text) == "meet at noon"
    assert (a.persistent, a.priority, a.ttl) == (False, 7, 30.0)
    assert a.props == ["a=1", "b=2", "c=3"]
    d = grammar.parse_line("pub -t T -f /tmp/x --persistent")
    assert isinstance(d, Command) and d.args.file == "/tmp/x" and d.args.persistent is True


def test_sub_options_and_quoted_selector() -> None:
    c = grammar.parse_line(
        "sub -t T -sel \"language = 'English' AND n > 3\" --durable d --count 2 --no-local"
    )
    assert isinstance(c, Command)
    assert c.args.selector == "language = 'English' AND n > 3"
    assert (c.args.durable, c.args.count, c.args.no_local) == ("d", 2, True)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("pub -t X", "-p -f is required"),
        ("pub -p x", "required: -t"),
        ("pub -t X -p a -f b", "not allowed"),
        ("pub -t X -p a --priority 12", "invalid choice"),
        ("pub -t X -p a --bogus", "unknown option --bogus"),
        ("unsub 1 2", "unrecognized arguments"),
        ("sub -t", "expected one argument"),
        ("sub -t A -q B", "not allowed"),
        ("receive -q Q --timeout soon", "not a number: soon"),
        ("create thing x", "invalid choice"),
        ("unsub one", "invalid int"),
        ('pub -t X -p "open', "No closing quotation"),
        ("frobnicate", "unknown command"),
        ("-ssl", "unknown command"),
    ],
)
def test_bad_commands_raise_a_usage_error(line: str, needle: str) -> None:
    with pytest.raises(UsageError) as exc:
        grammar.parse_line(line)
    assert needle in str(exc.value)
    name = line.split()[0]
    if name in grammar.COMMANDS:
        assert exc.value.usage.startswith(f"usage: {name} ")
        assert "\n" not in exc.value.usage  # one short line


def test_single_dash_options_are_not_abbreviated() -> None:
    for line in ["sub -t T -ss language=x", "pub -t T -p x --prio 3", "sub -t T -s x=1"]:
        with pytest.raises(UsageError) as exc:
            grammar.parse_line(line)
        assert "unknown option" in str(exc.value)
    c = grammar.parse_line("pub -tT -p x --priority=3 --ttl 1")
    assert isinstance(c, Command) and (c.args.topic, c.args.priority) == ("T", 3)
    with pytest.raises(UsageError) as exc:  # a negative number is a value, not an option
        grammar.parse_line("pub -t T -p x --ttl -1")
    assert "must be a number from 0 to" in str(exc.value)


def test_split_commands_respects_quotes_and_comments() -> None:
    assert grammar.split_commands('pub -t X -p "a;b"; sub -t Y # not; this') == [
        'pub -t X -p "a;b"',
        "sub -t Y",
    ]
    assert grammar.split_commands("pub -t X -p 'x;y' ;; status ;") == [
        "pub -t X -p 'x;y'",
        "status",
    ]
    assert grammar.split_commands("pub -p a\\;b") == ["pub -p a\\;b"]
    assert grammar.split_commands("# only a comment") == []


def test_every_command_has_help_and_a_summary() -> None:
    overview = grammar.overview()
    for name, (summary, _) in grammar.COMMANDS.items():
        assert summary and name in overview
        text = grammar.help_text(name)
        assert text.startswith(f"usage: {name}")
        assert len(text.splitlines()) >= 3  # usage, blank, description
    for name in grammar.COMMANDS:
        assert grammar.parse_line(f"{name} --help") == HelpRequest(name)
        assert grammar.parse_line(f"{name} -h") == HelpRequest(name)
    assert "-ssl" in grammar.option_strings("pub") and "-sel" in grammar.option_strings("sub")


def test_aliases() -> None:
    c = grammar.parse_line("quit")
    assert isinstance(c, Command) and c.name == "exit"


# ---------------------------------------------------------------- -ssl mapping


@pytest.mark.parametrize(
    ("regex", "clause"),
    [
        ("English|French", "language IN ('English','French')"),
        ("English", "language = 'English'"),
        ("it's", "language = 'it''s'"),
        ("Chat.*", "language LIKE 'Chat%' ESCAPE '\\' AND language NOT LIKE '%\n%'"),
        (
            "Chat.*|Lobby",
            "((language LIKE 'Chat%' ESCAPE '\\' AND language NOT LIKE '%\n%')"
            " OR language = 'Lobby')",
        ),
        ("a\n.*", None),  # a literal line feed beside '.*': no LIKE is exact
        ("a\\.b", "language = 'a.b'"),
        ("[a-z]+", None),
        ("(English|French)", None),
        ("Eng(lish)?", None),
    ],
)
def test_selector_clause(regex: str, clause: str | None) -> None:
    assert selector_clause("language", regex) == clause


@pytest.mark.parametrize(
    "regex",
    ["English|French", "Chat.*|x", "5%_.|a.c", "", "it's|a\\*", ".", ".*", "a\\\\.*", "é.|\\.x",
     "a\nb|c"],
)  # fmt: skip
@pytest.mark.parametrize(
    "value",
    ["English", "French", "Englis", "Chat", "Chatroom", "x", "5%_z", "abc", "", "a*",
     "Chat\nroom", "Chat\n", "\n", "a\nc", "a\nb", "chatroom", "CHAT", "a\\", "a\\bc", "a\\\n",
     "éé", "é😀", ".x", "\\x", "\r", "Chat\r\u2028"],
)  # fmt: skip
def test_translated_clause_selects_exactly_what_the_regex_matches(regex: str, value: str) -> None:
    """The clause (as the queue manager evaluates it) accepts exactly what DoDWAN's RE2
    full match does: line feeds (RE2 '.' skips them, LIKE '_'/'%' do not), case,
    backslashes, multi-byte characters."""
    [p] = parse_patterns([f"language={regex}"])
    assert p.clause is not None
    sel = jms_selector.parse(p.clause)
    assert sel.matches({"language": value}) == (compile_regex(regex).fullmatch(value) is not None)
    assert sel.matches({"language": value}) == p.matches(value)


def test_jms_header_names_get_no_clause() -> None:
    """In a selector ``JMSType`` is the message's header, not a property of that name."""
    assert selector_clause("JMSType", "x") is None
    assert selector_clause("JMSCorrelationID", "x") is None
    assert selector_clause("JMSXGroupID", "g1") == "JMSXGroupID = 'g1'"


def test_keys_that_are_not_selector_identifiers_are_only_checked_locally() -> None:
    assert selector_clause("my-key", "x") is None
    assert selector_clause("AND", "x") is None
    assert selector_clause("1st", "x") is None


def test_combined_selector() -> None:
    ps = parse_patterns(["language=English|French", "n=[0-9]+"])
    assert combined_selector("x = 'y'", ps) == "(x = 'y') AND language IN ('English','French')"
    assert combined_selector("x = 'y'", []) == "x = 'y'"
    assert combined_selector(None, parse_patterns(["n=[0-9]+"])) is None


def test_local_check_is_a_full_match_on_the_property_string() -> None:
    ps = parse_patterns(["language=English|French", "n=[0-9]+"])
    ok = TextMessage("hi", {"language": "French", "n": 42})
    assert accepts(ps, ok)
    assert not accepts(ps, TextMessage("hi", {"language": "Frenchy", "n": 42}))
    assert not accepts(ps, TextMessage("hi", {"language": "French", "n": 4.5}))
    assert not accepts(ps, TextMessage("hi", {"language": "French"}))  # missing property


@pytest.mark.parametrize("bad", ["novalue", "=x", "k=(", "k=a{2"])
def test_bad_patterns(bad: str) -> None:
    if bad == "k=a{2":  # RE2 reads a{2 as literal: valid
        assert parse_patterns([bad])[0].matches("a{2")
        return
    with pytest.raises(PatternError):
        parse_patterns([bad])


def test_publish_properties() -> None:
    assert parse_properties(["language=English", "empty="]) == {
        "language": "English",
        "empty": "",
    }
    for bad in ["noequals", "id=5", "jms_x=1", "=v"]:
        with pytest.raises(PatternError):
            parse_properties([bad])


# ---------------------------------------------------------------- printing


def _arrived(text: str, **props: object) -> TextMessage:
    m = TextMessage(text, dict(props))
    m.destination = Topic("ChatRoom1")
    m.message_id = "ID:h1-1"
    return m


def test_describe_shows_topic_id_properties_and_content() -> None:
    line = describe(_arrived("Hello", label="firstMSG", language="English"), 3)
    assert line == "[3] topic ChatRoom1 id firstMSG language=English: Hello"
    assert describe(_arrived("Hi")) == "topic ChatRoom1 id ID:h1-1: Hi"
    multi = describe(_arrived("one\ntwo", note="a b"))
    assert multi.splitlines() == ['topic ChatRoom1 id ID:h1-1 note="a b": one', "    two"]


# What a peer chooses in a message: escapes that clear and retitle the terminal, a C1 CSI,
# a right-to-left override that reverses the rest of the line, a zero-width space.
EVIL = "A\x1b[2J\x1b]0;pwned\x07B\x9b7mC\u202eDEF\u200b"
EVIL_SHOWN = "A\\x1b[2J\\x1b]0;pwned\\x07B\\x9b7mC\\u202eDEF\\u200b"


def test_describe_escapes_what_a_peer_chose() -> None:
    m = _arrived(f"body{EVIL}\r\n\tsecond é", label=f"L{EVIL}", color=f"c{EVIL}", k="v")
    m.destination = Topic(f"T{EVIL}")
    line = describe(m, 1)
    assert line.splitlines() == [
        f"[1] topic T{EVIL_SHOWN} id L{EVIL_SHOWN} color=c{EVIL_SHOWN} k=v: body{EVIL_SHOWN}\\x0d",
        "    \tsecond é",
    ]
    # a property with spaces is quoted as JSON; that escapes it already
    assert 'note="a \\u202e b"' in describe(_arrived("x", note="a \u202e b"))


def test_destinations_peers_and_status_escape_what_peers_chose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    console = _console(tmp_path)
    monkeypatch.setattr(Admin, "configured", property(lambda self: True))
    monkeypatch.setattr(Admin, "destinations", lambda self: ({f"t{EVIL}", "News"}, {f"q{EVIL}"}))
    peers = {f"h{EVIL}": {"address": ["127.0.0.1", 9], "silent_for": 1.0}}
    monkeypatch.setattr(Admin, "peers", lambda self: peers)
    status = {"host_id": f"me{EVIL}", "uptime": 1, "neighbours": [f"h{EVIL}"], "cache": {}}
    monkeypatch.setattr(Admin, "status", lambda self: status)
    console.run_text("destinations; peers; status")
    out, err = capsys.readouterr()
    assert f"topics:  News, t{EVIL_SHOWN}\n" in out
    assert f"queues:  q{EVIL_SHOWN}\n" in out
    assert f"h{EVIL_SHOWN}  127.0.0.1:9  heard 1.0 s ago\n" in out
    assert f"host id    me{EVIL_SHOWN}\n" in out and f"neighbours h{EVIL_SHOWN}\n" in out
    for c in "\x1b\x07\x9b\u202e\u200b":
        assert c not in out + err, (c, out, err)


# ---------------------------------------------------------------- completion and history


def _console(tmp_path: Path) -> Console:
    printer = Printer()
    return Console(Link("127.0.0.1:1", printer), Admin(tmp_path), printer)


def _complete(completer: ConsoleCompleter, text: str) -> list[str]:
    doc = Document(text, len(text))
    return [
        c.text for c in completer.get_completions(doc, CompleteEvent(completion_requested=True))
    ]


def test_completion_of_commands_options_and_destinations(tmp_path: Path) -> None:
    console = _console(tmp_path)
    console.topics |= {"ChatRoom1", "ChatRoom2", "News"}
    console.queues.add("MailBox1@h2")
    c = ConsoleCompleter(console)
    assert set(_complete(c, "su")) == {"sub", "subscriptions"}
    assert _complete(c, "pub -t Chat") == ["ChatRoom1", "ChatRoom2"]
    assert _complete(c, "send -q M") == ["MailBox1@h2"]
    assert "-ssl" in _complete(c, "pub -t X -s") and "-sel" not in _complete(c, "pub -s")
    assert set(_complete(c, "sub -t X -s")) == {"-ssl", "-sel"}
    assert _complete(c, "help rec") == ["receive"]
    assert _complete(c, "create q") == ["queue"]
    assert _complete(c, "status; pu") == ["pub"]
    (tmp_path / "payload.txt").write_text("x")
    assert _complete(c, f"pub -t X -f {tmp_path}/pay") == ["load.txt"]
    assert _complete(c, "nonsense -") == []


def test_history_file_and_fallback(tmp_path: Path) -> None:
    hist, warning = open_history(tmp_path / "deep" / "history")
    assert warning is None and (tmp_path / "deep" / "history").exists()
    hist.append_string("status")
    again, _ = open_history(tmp_path / "deep" / "history")
    assert "status" in list(again.load_history_strings())
    blocker = tmp_path / "file"
    blocker.write_text("")
    mem, warning = open_history(blocker / "history")  # parent is a file
    assert warning is not None and "history not kept" in warning
    mem.append_string("x")


# ---------------------------------------------------------------- admin discovery, errors


def test_admin_without_a_state_dir_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DODWAN_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    admin = Admin(None)
    assert not admin.configured
    with pytest.raises(AdminUnavailable) as exc:
        admin.peers()
    assert str(exc.value) == NEEDS_STATE_DIR and "--state-dir" in NEEDS_STATE_DIR
    with pytest.raises(AdminUnavailable) as exc2:
        Admin(tmp_path / "nothing").status()
    assert "no daemon running" in str(exc2.value)


def test_admin_destinations_from_directory_adverts_and_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import json

    from dodwan.daemon.client import AdminClient, ClientError

    advert = {"host": "h2", "topics": ["News"], "queues": ["Box"]}
    cache = [
        {"id": "d1", "complete": True, "descriptor": {"jms_kind": "directory"}},
        {"id": "d2", "complete": True, "descriptor": {"jms_kind": "directory"}},  # gone
        {"id": "d3", "complete": False, "descriptor": {"jms_kind": "directory"}},  # partial
        {"id": "m1", "descriptor": {"jms_kind": "message", "destination_type": "topic",
                                    "destination_id": "Chat"}},
        {"id": "m2", "descriptor": {"jms_kind": "message", "destination_type": "queue",
                                    "destination_id": "Jobs@h3"}},
        {"id": "m3", "descriptor": {"jms_kind": "message", "destination_type": "queue",
                                    "destination_id": "tmp.h1.1"}},
        {"id": "x", "descriptor": {"topic": "plain dodwan"}},
    ]  # fmt: skip
    asked: list[str] = []

    class Fake:
        def get(self, path: str) -> Any:
            asked.append(path)
            if path == "/cache":
                return cache
            if path == "/cache/d1?payload=1":
                return {"payload_b64": base64.b64encode(json.dumps(advert).encode()).decode()}
            raise ClientError("404 unknown message")

    made: list[Path] = []

    def for_state_dir(state_dir: Path, timeout: float = 30.0) -> Fake:
        made.append(Path(state_dir))
        return Fake()

    monkeypatch.setattr(AdminClient, "for_state_dir", staticmethod(for_state_dir))
    topics, queues = Admin(tmp_path).destinations()
    assert (topics, queues) == ({"News", "Chat"}, {"Box", "Jobs@h3"})
    assert asked == ["/cache", "/cache/d1?payload=1", "/cache/d2?payload=1"]
    assert made == [tmp_path]  # admin.json read once for the listing and every advert


def test_commands_without_a_daemon_fail_with_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DODWAN_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    url = "127.0.0.1:9"  # discard port: nothing listens
    rc = main(["--url", url, "-c", "pub -t X -p hi; peers; help pub; exit; status"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert err.count("error: ") == 2, err
    assert "cannot reach the daemon at 127.0.0.1:9" in err
    assert "--state-dir" in err
    assert "usage: pub" in out
    assert "daemon " not in out  # `exit` stopped before `status`
    assert "Traceback" not in out + err


def test_one_shot_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pub", "-t", "X"]) == 2
    out, err = capsys.readouterr()
    assert "one of the arguments -p -f is required" in err and out.startswith("usage: pub")
    assert main(["help", "sub"]) == 0
    assert "-ssl KEY=REGEX" in capsys.readouterr().out
    assert main(["-c", "help", "status"]) == 2


def test_file_payload_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console = _console(tmp_path)
    fake: Any = _FakeSession()
    console.link.session = lambda: fake  # type: ignore[method-assign]
    console.run_text(f"pub -t X -f {tmp_path}/missing")
    assert "does not exist" in capsys.readouterr().err
    assert console.failures == 1
    os.mkdir(tmp_path / "dir")
    console.run_text(f"pub -t X -f {tmp_path}/dir")
    assert "cannot read" in capsys.readouterr().err


class _FakeSession:
    def create_text_message(self, text: str, props: dict[str, object]) -> TextMessage:
        return TextMessage(text, props)


@pytest.mark.parametrize(
    "words",
    [
        ["pub", "-t", "X", "-p", "x", "--ttl", "-5"],
        ["send", "-q", "X", "-p", "x", "--ttl", "-5"],
        ["sub", "-t", "X", "--count", "0"],
        ["receive", "-q", "X", "--timeout", "-1"],
        ["unsub"],
        # infinite or huge: "unexpected OverflowError" (exit 1) once a daemon was reached
        ["receive", "-q", "X", "--timeout", "inf"],
        ["receive", "-q", "X", "--timeout", "1e300"],
        ["receive", "-q", "X", "--timeout", "31536001"],
        ["pub", "-t", "X", "-p", "x", "--ttl", "inf"],
        ["send", "-q", "X", "-p", "x", "--ttl", "1e300"],
        ["pub", "-t", "X", "-p", "x", "--ttl", "315360001"],
    ],
)
def test_one_shot_out_of_range_values_are_usage_errors(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", "127.0.0.1:9", *words]) == 2  # refused before any connection
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: {words[0]}"), out + err


def test_a_line_feed_separates_commands_like_a_semicolon() -> None:
    """A pasted block or a ``-c`` string of several lines: each line is a command (before,
    shlex read the line feed as a space and the lines became one command)."""
    assert grammar.split_commands("pub -t A -p one\npub -t B -p two # note; x\n\nstatus") == [
        "pub -t A -p one",
        "pub -t B -p two",
        "status",
    ]
    assert grammar.split_commands('pub -t A -p "two\nlines"; help') == [
        'pub -t A -p "two\nlines"',
        "help",
    ]


@pytest.mark.parametrize(
    "line",
    [
        "pub -t A -id one -p x -t B",
        "pub -t A -id one -id two -p x",
        "pub -t A -p one -p two",
        "send -q Q -p x --priority 3 --priority 5",
        "sub -t T --count 1 --count 2",
        "sub -t T -sel \"a = '1'\" -sel \"b = '2'\"",
        "receive -q Q --timeout 1 --timeout 2",
        "unsub -t A -t B",
    ],
)
def test_an_option_given_twice_is_refused(line: str) -> None:
    """argparse keeps the last value silently: ``pub -t A … -t B`` published to B only."""
    with pytest.raises(UsageError) as exc:
        grammar.parse_line(line)
    assert "given twice: give it once" in str(exc.value)
    assert exc.value.usage.startswith(f"usage: {line.split()[0]} ")


def test_repeatable_options_stay_repeatable() -> None:
    c = grammar.parse_line("pub -t A -p x -ssl a=1 -ssl b=2")
    assert isinstance(c, Command) and c.args.props == ["a=1", "b=2"]
    assert not hasattr(c.args, grammar._GIVEN)


def test_the_bounds_themselves_are_allowed() -> None:
    c = grammar.parse_line("pub -t X -p x --ttl 315360000")
    assert isinstance(c, Command) and c.args.ttl == 3650 * 86400
    c = grammar.parse_line("receive -q X --timeout 31536000")
    assert isinstance(c, Command) and c.args.timeout == 365 * 86400
