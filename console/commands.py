"""What each console command does, on the daemon link and the admin API.

:class:`Console` runs parsed commands (from any mode) and turns every failure — bad usage,
an unreachable daemon, a refused request, an unreadable file — into one printed message;
nothing a user types can crash it. ``run_text`` runs text of commands separated by ``;`` or
line feeds.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dodwan.textsafe import safe
from dodwan.units import human_size
from joms.api import Message, Queue, Topic
from joms.errors import JMSException, RequestTimeoutException

from . import grammar
from .admin import Admin, AdminUnavailable
from .grammar import Command, HelpRequest, UsageError
from .link import TIMEOUT, Link, NotConnected, Subscription, plural
from .output import LABEL, OutputClosed, Printer, describe
from .selection import (
    PatternError,
    PropertyPattern,
    combined_selector,
    parse_patterns,
    parse_properties,
)

_MAX_FILE = 16 * 1024 * 1024


class CommandError(Exception):
    """A command that cannot be done as asked (message for the user)."""


class Console:
    """Runs commands; ``failures`` counts those that failed (for scripts' exit status)."""

    def __init__(self, link: Link, admin: Admin, printer: Printer) -> None:
        self.link = link
        self.admin = admin
        self.out = printer
        self.failures = 0
        self.interactive = False
        """At the prompt, Ctrl-C stops the running command only; in a script or a one-shot
        command it stops the console (exit 130)."""
        self.topics: set[str] = set()
        self.queues: set[str] = set()
        link.on_arrival = self._remember
        self._handlers: dict[str, Callable[[argparse.Namespace], bool]] = {
            "pub": self.do_pub,
            "send": self.do_send,
            "sub": self.do_sub,
            "unsub": self.do_unsub,
            "receive": self.do_receive,
            "create": self.do_create,
            "destinations": self.do_destinations,
            "subscriptions": self.do_subscriptions,
            "peers": self.do_peers,
            "status": self.do_status,
            "help": self.do_help,
            "exit": self.do_exit,
        }

    # ------------------------------------------------------------------ running
    def run_text(self, text: str) -> bool:
        """Run every command of ``text`` (``;`` or line feeds between them); False once one
        of them is ``exit``."""
        return all(self.run_one(part) for part in grammar.split_commands(text))

    def run_one(self, text: str) -> bool:
        try:
            parsed = grammar.parse_line(text)
        except UsageError as exc:
            self._usage_error(exc)
            return not self.out.closed.is_set()
        return self.execute(parsed)

    def execute(self, parsed: Command | HelpRequest) -> bool:
        """Run one parsed command; False when the console should end (``exit``, or
        nobody reads stdout any more)."""
        try:
            if isinstance(parsed, HelpRequest):
                self.out.line(grammar.help_text(parsed.name))
                return True
            return self._handlers[parsed.name](parsed.args) and not self.out.closed.is_set()
        except OutputClosed:
            return False
        except UsageError as exc:
            self._usage_error(exc)
        except (CommandError, NotConnected, AdminUnavailable, PatternError) as exc:
            self._fail(str(exc))
        except JMSException as exc:
            self._fail(self._daemon_failure(parsed.name, exc))
        except KeyboardInterrupt:
            if not self.interactive:
                raise
            self._fail("interrupted")
        except Exception as exc:  # a console must survive its own bugs too
            self._fail(f"unexpected {type(exc).__name__}: {exc}")
        return True

    def _daemon_failure(self, name: str, exc: JMSException) -> str:
        """What a request that failed at the daemon means: refused (an ERROR frame: nothing
        done), or, when the daemon did not answer in time or the connection was lost while
        waiting, an unknown outcome (a hung daemon publishes the message once it resumes):
        never called a refusal, so that nobody sends a duplicate believing it refused."""
        publishing = name in ("pub", "send")
        unknown = (
            "the message may or may not have been published; check (`sub`/`receive` on its "
            "destination, or `dodwan cache ls`) before sending it again"
            if publishing
            else f"`{name}` may or may not have been done"
        )
        if isinstance(exc, RequestTimeoutException):
            return f"no answer from the daemon within {TIMEOUT:g} s (hung?): {unknown}"
        lost = self.link.loss(exc)
        if lost is not None:  # (a message being received goes back: nothing unknown there)
            return f"connection to the daemon lost ({lost})" + (
                f": {unknown}" if publishing else ""
            )
        return f"the daemon refused: {exc}"

    def _fail(self, text: str) -> None:
        self.failures += 1
        self.out.error(text)

    def _usage_error(self, exc: UsageError) -> None:
        self.failures += 1
        self.out.error(str(exc))
        if exc.usage:
            with contextlib.suppress(OutputClosed):  # (the caller sees out.closed)
                self.out.line(exc.usage)

    def _remember(self, msg: Message) -> None:
        dest = msg.destination
        if isinstance(dest, Topic):
            self.topics.add(dest.name)
        elif isinstance(dest, Queue):
            self.queues.add(dest.name)

    # ------------------------------------------------------------------ publishing
    def _message(self, args: argparse.Namespace) -> Message:
        session = self.link.session()
        props: dict[str, Any] = parse_properties(args.props)
        if args.label is not None:
            props[LABEL] = args.label
        if args.text is not None:
            return session.create_text_message(" ".join(args.text), props)
        path = Path(args.file).expanduser()
        try:
            with path.open("rb") as f:  # at most one byte more than allowed, any kind of file:
                data = f.read(_MAX_FILE + 1)  # (/dev/zero or a pipe has no size to check)
        except FileNotFoundError:
            raise CommandError(f"file {args.file} does not exist") from None
        except OSError as exc:
            raise CommandError(f"cannot read {args.file}: {exc.strerror}") from None
        if len(data) > _MAX_FILE:
            raise CommandError(f"{args.file} holds more than 16 MiB: a message takes at most that")
        try:
            return session.create_text_message(data.decode("utf-8"), props)
        except UnicodeDecodeError:
            return session.create_bytes_message(data, props)

    def _publish(self, args: argparse.Namespace, destination: Topic | Queue) -> None:
        msg = self._message(args)
        producer = self.link.session().create_producer(destination)
        producer.send(
            msg,
            delivery_mode=2 if args.persistent else 1,
            priority=args.priority,
            time_to_live=args.ttl,
        )
        what = f" {args.label}" if args.label is not None else ""
        kind = "topic" if isinstance(destination, Topic) else "queue"
        self.out.line(f"The message{what} has been published to {kind} {destination.name}")

    def do_pub(self, args: argparse.Namespace) -> bool:
        self._publish(args, Topic(args.topic))
        self.topics.add(args.topic)
        return True

    def do_send(self, args: argparse.Namespace) -> bool:
        self._publish(args, Queue(args.queue))
        self.queues.add(args.queue)
        return True

    # ------------------------------------------------------------------ receiving
    def do_sub(self, args: argparse.Namespace) -> bool:
        patterns = parse_patterns(args.patterns)
        selector = combined_selector(args.selector, patterns)
        if args.queue is not None and args.durable:
            raise CommandError("--durable is for topics; a queue keeps its messages anyway")
        if args.durable and not self.link.client_id:
            raise CommandError(
                "durable subscriptions need a client id: start the console with --client-id ID"
            )
        if args.queue is not None:
            _only_server_side(patterns)
        dest: Topic | Queue = Topic(args.topic) if args.topic is not None else Queue(args.queue)
        sub = self.link.subscribe(
            dest,
            selector,
            patterns,
            durable=args.durable,
            no_local=args.no_local,
            count=args.count,
            announce=self._announce,
        )
        (self.topics if isinstance(dest, Topic) else self.queues).add(sub.destination.name)
        return True

    def _announce(self, sub: Subscription) -> None:
        self.out.line(f"[{sub.number}] subscribed to {sub.describe()}")
        self.out.line("Waiting ....")

    def do_unsub(self, args: argparse.Namespace) -> bool:
        subs = self.link.active()
        if args.all:
            chosen = subs
        elif args.number is not None:
            chosen = [s for s in subs if s.number == args.number]
            if not chosen:
                raise CommandError(f"no subscription {args.number} (see `subscriptions`)")
        elif args.topic is not None or args.queue is not None:
            want = Topic(args.topic) if args.topic is not None else Queue(args.queue)
            chosen = [s for s in subs if s.destination == want]
            if not chosen:
                raise CommandError(f"no subscription to {want.name}")
        else:  # --durable NAME alone (the grammar refuses an unsub that names nothing)
            chosen = []
        for s in chosen:
            self.link.end(s)
            if s.durable and s.durable != args.durable:
                self.out.line(
                    f"[{s.number}] stopped receiving from {s.describe()}; the daemon keeps "
                    f"durable subscription {s.durable} (`unsub --durable {s.durable}` deletes it)"
                )
            else:
                self.out.line(f"[{s.number}] unsubscribed from {s.describe()}")
        if args.durable:
            self.link.delete_durable(args.durable)
            self.out.line(f"durable subscription {args.durable} deleted")
        return True

    def do_receive(self, args: argparse.Namespace) -> bool:
        patterns = parse_patterns(args.patterns)
        selector = combined_selector(args.selector, patterns)
        _only_server_side(patterns)
        self.queues.add(args.queue)
        msg = self.link.receive(Queue(args.queue), selector, args.timeout)
        if msg is None:
            raise CommandError(f"no message on queue {args.queue} within {args.timeout:g} s")
        self.out.line(describe(msg))
        return True

    # ------------------------------------------------------------------ destinations
    def do_create(self, args: argparse.Namespace) -> bool:
        if args.kind == "topic":
            Topic(args.name)
            self.topics.add(args.name)
            self.out.line(f"topic {args.name} is ready (topics need no creation)")
            return True
        if "@" in args.name:
            raise CommandError("a queue is created by its manager: give NAME, without @HOST")
        session = self.link.session()
        consumer = session.create_consumer(Queue(args.name))  # the first use creates it
        consumer.close()
        self.queues.add(args.name)
        self.out.line(f"queue {args.name} created, managed by this host")
        return True

    def do_destinations(self, args: argparse.Namespace) -> bool:
        topics, queues = set(self.topics), set(self.queues)
        note = ""
        if self.admin.configured:
            try:
                t, q = self.admin.destinations()
                topics |= t
                queues |= q
                self.topics |= t
                self.queues |= q
            except AdminUnavailable as exc:
                note = f"(network view unavailable: {exc})"
        else:
            note = "(only what this console has seen; with --state-dir also the network's)"
        # names from directory adverts: any host may publish one
        self.out.line("topics:  " + (", ".join(sorted(map(safe, topics))) or "(none known)"))
        self.out.line("queues:  " + (", ".join(sorted(map(safe, queues))) or "(none known)"))
        if note:
            self.out.line(note)
        return True

    def do_subscriptions(self, args: argparse.Namespace) -> bool:
        subs = self.link.active()
        if not subs:
            self.out.line("no subscriptions")
        for s in subs:
            extra = f", {s.filtered} filtered out" if s.filtered else ""
            self.out.line(f"[{s.number}] {s.describe()} ({s.received} received{extra})")
        return True

    # ------------------------------------------------------------------ daemon
    def do_peers(self, args: argparse.Namespace) -> bool:
        peers = self.admin.peers()
        if not peers:
            self.out.line("no neighbours")
        now = time.time()
        for host, p in sorted(peers.items()):
            addr = p.get("address")
            where = f"{addr[0]}:{addr[1]}" if isinstance(addr, list) and len(addr) >= 2 else "?"
            silent = p.get("silent_for", now - float(p.get("last_heard", now)))
            self.out.line(f"{safe(host)}  {where}  heard {float(silent):.1f} s ago")
        return True

    def do_status(self, args: argparse.Namespace) -> bool:
        """The STOMP link, then the daemon; fails (exit 1) when either cannot be reached."""
        link = self.link
        reason = None
        try:
            link.connect()
        except (NotConnected, JMSException) as exc:
            reason = str(exc)
        state = "connected" if link.connected else "not connected"
        self.out.line(f"daemon     {link.url or '(gateway not found)'}: {state}")
        subs = plural(len(link.active()), "subscription")
        self.out.line(f"client id  {link.client_id or '(none)'}, {subs} in this console")
        problem = None
        try:
            st = self.admin.status()
        except AdminUnavailable as exc:
            problem = str(exc)
        else:
            cache = st.get("cache", {})
            self.out.line(f"host id    {safe(st.get('host_id'))}")
            self.out.line(f"uptime     {float(st.get('uptime', 0)):.0f} s")
            self.out.line(
                f"neighbours {', '.join(map(safe, st.get('neighbours', []))) or '(none)'}"
            )
            self.out.line(
                f"cache      {plural(int(cache.get('messages', 0)), 'message')}, "
                f"{human_size(cache.get('bytes', 0))} of {human_size(cache.get('capacity', 0))}"
            )
        if not link.connected:
            raise CommandError(reason or link.last_error or f"not connected to {link.url}")
        if problem is not None:
            raise CommandError(problem)
        return True

    # ------------------------------------------------------------------ console
    def do_help(self, args: argparse.Namespace) -> bool:
        if args.topic is None:
            self.out.line(grammar.overview())
            return True
        name = grammar.ALIASES.get(args.topic, args.topic)
        if name not in grammar.COMMANDS:
            raise UsageError(f"unknown command {args.topic!r}", grammar.usage("help"))
        self.out.line(grammar.help_text(name))
        return True

    def do_exit(self, args: argparse.Namespace) -> bool:
        return False


def _only_server_side(patterns: list[PropertyPattern]) -> None:
    """On a queue, every ``-ssl`` pattern must become a selector clause: the queue's manager
    then hands out only matching messages. A pattern checked here, after the message was
    taken from the queue, would throw the others away."""
    local = [f"{p.key}={p.regex}" for p in patterns if p.clause is None]
    if local:
        raise CommandError(
            f"-ssl {' '.join(local)} has no selector equivalent, so on a queue it would "
            "consume and discard the messages it rejects: use literals, '|' and '.*', "
            "or a -sel selector"
        )
