"""The ``joms`` entry point: picks the mode and runs commands with one grammar.

* ``joms``                      interactive prompt (stdin is a terminal)
* ``joms pub -t T -p Hello``    one command, then exit (``sub`` follows until Ctrl-C or
  ``--count``)
* ``joms -c "cmd; cmd"``        a short script
* ``... | joms``                commands read from stdin, one or more per line

Scripts end once their commands ran and every ``sub --count N`` got its messages. The exit
status is 0 when every command succeeded, 1 otherwise, 2 for bad console options, 141
once nobody reads stdout any more (``joms sub -t T | head -1``: the console stops quietly,
see output.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from dodwan.pipes import BROKEN_PIPE_STATUS
from joms.api.transport import parse_url
from joms.errors import JMSException

from . import grammar
from .admin import Admin, AdminUnavailable
from .commands import Console
from .grammar import Command, UsageError
from .link import Link, NotConnected
from .output import OutputClosed, Printer

DEFAULT_URL = "stomp://127.0.0.1:61613"


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="joms",
        description="JOMS console: publish/subscribe and queues on the local JOMS daemon.",
        epilog="commands: "
        + ", ".join(grammar.COMMANDS)
        + ". `joms help COMMAND` shows one command's options.",
    )
    p.add_argument(
        "--url",
        help="the daemon's STOMP gateway (default: the one the daemon of --state-dir "
        f"serves, else {DEFAULT_URL})",
    )
    p.add_argument(
        "--state-dir",
        help="the daemon's state directory, for peers, status and the network's destinations",
    )
    p.add_argument("--client-id", help="JMS client id (needed for durable subscriptions)")
    p.add_argument("--login", help="STOMP login, if the gateway asks for one")
    p.add_argument("--passcode", help="STOMP passcode")
    p.add_argument(
        "--history",
        metavar="FILE",
        help="history file of the prompt (default ~/.local/share/joms/history)",
    )
    p.add_argument("-c", dest="commands", metavar="COMMANDS", help='run "cmd; cmd; ..." and exit')
    p.add_argument("command", nargs=argparse.REMAINDER, help="one command to run, then exit")
    return p


def _gateway_of(admin: Admin) -> Callable[[], str]:
    def locate() -> str:
        try:
            return admin.gateway_url()
        except AdminUnavailable as exc:
            raise NotConnected(str(exc)) from None

    return locate


def _follow(console: Console, stop: threading.Event) -> None:
    """Keep a one-shot ``sub`` running until its --count is reached or Ctrl-C."""
    if any(s.count is None for s in console.link.active()):
        console.out.line("(Ctrl-C to stop)")
    while console.link.active() and not console.out.reader_gone() and not stop.wait(0.2):
        pass


def main(argv: list[str] | None = None) -> int:
    args = _top_parser().parse_args(argv)
    printer = Printer()
    admin = Admin(args.state_dir)
    url, locate = args.url, None
    if url is not None:
        try:
            parse_url(url)
        except (JMSException, ValueError) as exc:
            printer.error(f"bad --url {url!r} ({exc}): expected stomp://HOST:PORT or HOST:PORT")
            return 2
    elif admin.configured:
        locate = _gateway_of(admin)  # what the daemon of the state directory serves
    else:
        url = DEFAULT_URL
    link = Link(
        url,
        printer,
        client_id=args.client_id,
        login=args.login,
        passcode=args.passcode,
        locate=locate,
        explain=admin.explain if locate is None else None,
    )
    console = Console(link, admin, printer)
    stop = threading.Event()
    try:
        if args.commands is not None:
            if args.command:
                printer.error("give either -c COMMANDS or one command, not both")
                return 2
            for part in grammar.split_commands(args.commands):
                if not console.run_one(part):
                    break
            console.link.wait_counted(stop)
        elif args.command:
            try:
                parsed = grammar.parse_words(args.command)
            except UsageError as exc:
                printer.error(str(exc))
                if exc.usage:
                    printer.line(exc.usage)
                return 2
            console.execute(parsed)
            if isinstance(parsed, Command) and parsed.name == "sub" and not console.failures:
                _follow(console, stop)
        elif sys.stdin.isatty():
            from . import interactive

            try:
                link.connect()
                state = f"connected to {link.url}"
            except NotConnected as exc:
                state = f"{exc}; retrying in the background"
                link.start_retrying()
            banner = f"JOMS console, {state}. `help` lists the commands, Ctrl-D leaves."
            history = Path(args.history) if args.history else interactive.default_history_file()
            return interactive.run(console, history, banner)  # typing errors are no failure
        else:
            for line in sys.stdin:
                if not console.run_text(line):
                    break
            console.link.wait_counted(stop)
    except KeyboardInterrupt:
        stop.set()
        return 130
    except OutputClosed:
        pass
    finally:
        link.close()
    if printer.closed.is_set():
        return BROKEN_PIPE_STATUS
    return 1 if console.failures else 0


if __name__ == "__main__":
    sys.exit(main())
