"""The console's one command grammar, shared by every mode (prompt, ``-c``, stdin, one-shot).

Owns: splitting a line into commands (``;`` and line feeds outside quotes) and words (shell quoting), one
argparse parser per command (the paper's single-dash options ``-t -q -id -p -f -ssl -sel``
kept exactly), the usage and help texts. Parsing never exits the process: a bad command
raises :class:`UsageError` with a short usage line.
"""

from __future__ import annotations

import argparse
import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn


class UsageError(Exception):
    """A command line that does not follow the grammar; ``usage`` is the short usage line."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


_GIVEN = "_options_given"
"""Namespace attribute where :class:`_StoreOnce` notes the options seen (removed after)."""


class _StoreOnce(argparse._StoreAction):
    """The ``store`` action, refusing an option given twice: argparse would keep the last
    value silently (``pub -t A -p x -t B`` published to B only, pasted lines run as one
    command kept only the last of each)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if self.option_strings:
            if self.dest in given:
                raise argparse.ArgumentError(self, "given twice: give it once")
            given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting; an option that takes a value
    may be given once (``-ssl`` is the repeatable one)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, _one_line(self.format_usage()))

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or "bad command", _one_line(self.format_usage()))


@dataclass(frozen=True)
class Command:
    """A parsed command: its name and its argparse namespace."""

    name: str
    args: argparse.Namespace


@dataclass(frozen=True)
class HelpRequest:
    """``CMD -h``/``CMD --help``: show the help of ``name``."""

    name: str


def _parser(name: str, summary: str, epilog: str = "") -> _Parser:
    return _Parser(
        prog=name,
        description=textwrap.fill(summary, 78),
        epilog=epilog or None,
        add_help=False,
        allow_abbrev=False,
        exit_on_error=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _publish_options(p: _Parser, kind: str) -> None:
    flag, dest = ("-t", "topic") if kind == "topic" else ("-q", "queue")
    p.add_argument(flag, dest=dest, required=True, metavar=kind.upper(), help=f"the {kind}")
    p.add_argument(
        "-id", dest="label", metavar="ID", help="a name for the message (its `label` property)"
    )
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument(
        "-p", dest="text", nargs="+", metavar="TEXT", help="text payload (words are joined)"
    )
    body.add_argument("-f", dest="file", metavar="FILE", help="payload read from FILE")
    p.add_argument(
        "-ssl",
        dest="props",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="string property of the message (repeatable)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--persistent",
        dest="persistent",
        action="store_true",
        default=True,
        help="persistent delivery (the default): evicted after non-persistent messages",
    )
    mode.add_argument(
        "--non-persistent", dest="persistent", action="store_false", help="non-persistent"
    )
    p.add_argument(
        "--priority", type=int, default=4, choices=range(10), metavar="N", help="0-9 (default 4)"
    )
    p.add_argument(
        "--ttl",
        type=_seconds(MAX_TTL),
        default=0.0,
        metavar="SECONDS",
        help="lifetime in the network, up to 3650 days (default: the daemon's, 1 h)",
    )


MAX_TTL = 3650 * 86400.0
"""``--ttl`` at most: 3650 days, the largest ``limits.max_ttl`` a daemon takes."""
MAX_TIMEOUT = 365 * 86400.0
"""``receive --timeout`` at most: a year (``inf`` overflowed the wait: OverflowError)."""


def _seconds(most: float) -> Callable[[str], float]:
    """An argparse type: seconds, a finite number from 0 to ``most``."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text}") from None
        if not 0 <= value <= most:  # also refuses nan and inf
            raise argparse.ArgumentTypeError(f"must be a number from 0 to {most:.0f}, not {text}")
        return value

    return convert


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _filter_options(p: _Parser) -> None:
    p.add_argument(
        "-ssl",
        dest="patterns",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=REGEX",
        help="DoDWAN selection pattern on a property: the whole value must match REGEX",
    )
    p.add_argument(
        "-sel", dest="selector", metavar="SELECTOR", help="JMS message selector (quote it)"
    )


def _build_pub() -> _Parser:
    p = _parser(
        "pub",
        "Publish a message to a topic.",
        "example: pub -t ChatRoom1 -id firstMSG -p Hello -ssl language=English",
    )
    _publish_options(p, "topic")
    return p


def _build_send() -> _Parser:
    p = _parser(
        "send",
        "Send a message to a queue (NAME here, NAME@HOST elsewhere, NAME@* from the directory).",
        "example: send -q MailBox1@h2 -p 'meet at noon' --priority 7",
    )
    _publish_options(p, "queue")
    return p


def _build_sub() -> _Parser:
    p = _parser(
        "sub",
        "Subscribe to a topic (or a queue): messages are printed as they arrive, in the "
        "background, while the prompt stays usable.",
        "example: sub -t ChatRoom1 -ssl language=English|French\n"
        "         sub -t ChatRoom1 -sel \"language = 'English' AND urgent = 'yes'\"",
    )
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("-t", dest="topic", metavar="TOPIC", help="the topic")
    dest.add_argument("-q", dest="queue", metavar="QUEUE", help="a queue (competing receivers)")
    _filter_options(p)
    p.add_argument(
        "--durable",
        metavar="NAME",
        help="durable subscription NAME (needs joms --client-id): kept while away",
    )
    p.add_argument("--no-local", action="store_true", help="skip messages sent by this console")
    p.add_argument(
        "--count",
        type=_positive_int,
        metavar="N",
        help="stop after N messages (scripts wait for them)",
    )
    return p


def _build_unsub() -> _Parser:
    p = _parser(
        "unsub",
        "End subscriptions: by number (see `subscriptions`), topic or queue name, or all.",
        "example: unsub 1    unsub -t ChatRoom1    unsub --durable chat",
    )
    p.add_argument("number", nargs="?", type=int, metavar="N", help="subscription number")
    p.add_argument("-t", dest="topic", metavar="TOPIC", help="every subscription to TOPIC")
    p.add_argument("-q", dest="queue", metavar="QUEUE", help="every subscription to QUEUE")
    p.add_argument("--all", action="store_true", help="every subscription of this console")
    p.add_argument(
        "--durable",
        metavar="NAME",
        help="delete durable subscription NAME (and the messages waiting for it)",
    )
    return p


def _build_receive() -> _Parser:
    p = _parser(
        "receive",
        "Receive one message from a queue, waiting up to --timeout seconds.",
        "example: receive -q MailBox1 --timeout 30",
    )
    p.add_argument("-q", dest="queue", required=True, metavar="QUEUE", help="the queue")
    _filter_options(p)
    p.add_argument(
        "--timeout",
        type=_seconds(MAX_TIMEOUT),
        default=10.0,
        metavar="S",
        help="seconds to wait, up to a year (default 10)",
    )
    return p


def _build_create() -> _Parser:
    p = _parser(
        "create",
        "Create a destination: a queue is managed by this host; a topic is only remembered "
        "(topics need no creation).",
        "example: create queue MailBox1",
    )
    p.add_argument("kind", choices=["topic", "queue"], help="topic or queue")
    p.add_argument("name", metavar="NAME", help="its name")
    return p


def _build_plain(name: str, summary: str, epilog: str = "") -> Callable[[], _Parser]:
    def build() -> _Parser:
        return _parser(name, summary, epilog)

    return build


def _build_help() -> _Parser:
    p = _parser("help", "Show the commands, or the help of one command.", "example: help sub")
    p.add_argument("topic", nargs="?", metavar="COMMAND", help="a command")
    return p


COMMANDS: dict[str, tuple[str, Callable[[], _Parser]]] = {
    "pub": ("publish a message to a topic", _build_pub),
    "sub": ("subscribe to a topic (messages print as they arrive)", _build_sub),
    "unsub": ("end subscriptions", _build_unsub),
    "send": ("send a message to a queue", _build_send),
    "receive": ("receive one message from a queue", _build_receive),
    "create": ("create a topic or queue", _build_create),
    "destinations": (
        "list known topics and queues",
        _build_plain(
            "destinations",
            "List the topics and queues known: used by this console, seen in messages, and "
            "(with --state-dir) advertised by hosts in the network.",
        ),
    ),
    "subscriptions": (
        "list this console's subscriptions",
        _build_plain("subscriptions", "List this console's subscriptions and what they got."),
    ),
    "peers": (
        "list the daemon's current neighbours",
        _build_plain("peers", "List the daemon's current neighbours (needs joms --state-dir DIR)."),
    ),
    "status": (
        "show the connection and the daemon's status",
        _build_plain(
            "status",
            "Show the console's connection and the daemon's id, neighbours and cache "
            "(the daemon part needs joms --state-dir DIR).",
        ),
    ),
    "help": ("show help: help [COMMAND]", _build_help),
    "exit": ("leave the console (also quit, Ctrl-D)", _build_plain("exit", "Leave the console.")),
}

ALIASES = {"quit": "exit", "publish": "pub", "subscribe": "sub", "unsubscribe": "unsub"}

_PARSERS: dict[str, _Parser] = {}


def parser_for(name: str) -> _Parser:
    """The parser of command ``name`` (built once)."""
    p = _PARSERS.get(name)
    if p is None:
        p = _PARSERS[name] = COMMANDS[name][1]()
    return p


def option_strings(name: str) -> list[str]:
    """The options of command ``name``, for completion."""
    out: list[str] = []
    for action in parser_for(name)._actions:
        out.extend(action.option_strings)
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def usage(name: str) -> str:
    """The short usage line of command ``name``."""
    return _one_line(parser_for(name).format_usage())


def help_text(name: str) -> str:
    return parser_for(name).format_help().rstrip()


def overview() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["commands (help COMMAND for details):"]
    lines += [f"  {n:<{width}}  {s}" for n, (s, _) in COMMANDS.items()]
    return "\n".join(lines)


def split_commands(line: str) -> list[str]:
    """Split ``line`` at each ``;`` and each line feed outside quotes (several lines pasted
    at the prompt, or given to ``-c``, are several commands); a ``#`` word starts a comment,
    which a line feed ends."""
    parts: list[str] = []
    cur: list[str] = []
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            cur.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\" and i + 1 < len(line):
            cur += [c, line[i + 1]]
            i += 1
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c == "#" and (not cur or cur[-1].isspace()):
            end = line.find("\n", i)
            if end < 0:
                break
            i = end  # the line feed ends the comment and the command
            continue
        elif c in ";\n":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_words(words: list[str]) -> Command | HelpRequest:
    """Parse one command given as words (``["pub", "-t", "X", ...]``)."""
    if not words:
        raise UsageError("empty command")
    name = ALIASES.get(words[0], words[0])
    if name not in COMMANDS:
        raise UsageError(f"unknown command {words[0]!r}", "commands: " + ", ".join(COMMANDS))
    rest = words[1:]
    if "-h" in rest or "--help" in rest:
        return HelpRequest(name)
    _check_options(name, rest)
    try:
        args = parser_for(name).parse_args(rest)
    except argparse.ArgumentError as exc:  # exit_on_error=False path
        raise UsageError(str(exc), usage(name)) from None
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc), usage(name)) from None
    vars(args).pop(_GIVEN, None)
    if name == "unsub" and not (
        args.number is not None or args.topic or args.queue or args.all or args.durable
    ):
        raise UsageError("say which: N, -t TOPIC, -q QUEUE, --all or --durable NAME", usage(name))
    return Command(name, args)


def _check_options(name: str, words: list[str]) -> None:
    """Refuse option abbreviations (argparse 3.11 still expands ``-ss`` to ``-ssl``)."""
    known = set(option_strings(name))
    for w in words:
        if w == "--":
            return
        if not w.startswith("-") or w == "-" or w[1:2].isdigit() or w[1:2] == ".":
            continue
        opt = w.split("=", 1)[0] if w.startswith("--") else w
        if opt not in known and w[:2] not in known:
            raise UsageError(f"unknown option {opt}", usage(name))


def parse_line(text: str) -> Command | HelpRequest:
    """Parse one command written as a shell-quoted line."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        first = text.split()[0] if text.split() else ""
        name = ALIASES.get(first, first)
        raise UsageError(
            f"cannot read the line: {exc}", usage(name) if name in COMMANDS else ""
        ) from None
    return parse_words(words)
