"""Chat over a JOMS topic: each line you type is published; messages in your languages are shown.

    .venv/bin/python examples/chat.py --url stomp://127.0.0.1:61613 --name alice --language English
    .venv/bin/python examples/chat.py --demo        # two in-process hosts, a scripted conversation

The subscription is durable (client id = your name), so messages sent while you are away
are waiting when you come back; the selector keeps only the languages you read.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable

import joms


def sender_of(msg: joms.Message) -> str:
    """Who sent it: the ``sender`` property chat.py sets; other publishers (the ``joms``
    console, any STOMP client) may not set it."""
    sender = msg.get_property("sender")
    return "unknown sender" if sender is None or sender == "" else str(sender)


def chat(
    url: str,
    name: str,
    language: str,
    reads: list[str],
    lines: Iterable[str],
    room: str = "ChatRoom1",
    linger: float = 1.0,
) -> list[str]:
    """Publish ``lines``; return what was received (and print it)."""
    got: list[str] = []
    with joms.connect(url, client_id=name) as conn:
        session = conn.create_session()
        topic = session.create_topic(room)
        langs = ",".join(f"'{lang}'" for lang in reads)
        sub = session.create_durable_subscriber(
            topic, f"chat-{room}", selector=f"language IN ({langs})", no_local=True
        )

        def show(msg: joms.Message) -> None:
            assert isinstance(msg, joms.TextMessage)
            line = f"[{sender_of(msg)}] {msg.text}"
            got.append(line)
            print(f"{name} sees {line}", flush=True)

        sub.message_listener = show
        producer = session.create_producer(topic)
        for text in lines:
            producer.send(
                session.create_text_message(
                    text.rstrip("\n"), properties={"language": language, "sender": name}
                )
            )
        time.sleep(linger)
        sub.close()
    return got


def demo() -> dict[str, list[str]]:
    from _demo import loopback_hosts

    with loopback_hosts(2) as (a, b):
        # bob reads English and French; he subscribes first (durable), then alice talks
        chat(b.stomp_url, "bob", "French", ["English", "French"], [], linger=0.1)
        chat(
            a.stomp_url, "alice", "English", ["English"], ["hello bob", "how are you?"], linger=0.1
        )
        chat(a.stomp_url, "carl", "German", ["German"], ["hallo"], linger=0.1)
        bob = chat(b.stomp_url, "bob", "French", ["English", "French"], ["salut !"], linger=3.0)
        return {"bob": bob}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", default="stomp://127.0.0.1:61613")
    ap.add_argument("--name", default="me")
    ap.add_argument("--language", default="English")
    ap.add_argument("--reads", default="English,French", help="languages you read")
    ap.add_argument("--room", default="ChatRoom1")
    ap.add_argument("--demo", action="store_true")
    args = ap.parse_args()
    if args.demo:
        demo()
        return 0
    try:
        chat(args.url, args.name, args.language, args.reads.split(","), sys.stdin, args.room)
    except joms.JMSException as exc:
        print(f"chat: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
