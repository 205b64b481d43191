"""Request/reply over JOMS: JMSReplyTo names a temporary queue, JMSCorrelationID pairs answers.

    .venv/bin/python examples/request_reply.py server --url stomp://127.0.0.1:61613
    .venv/bin/python examples/request_reply.py client --url stomp://OTHER:61613 --service calc@HOST 1+2 3*4
    .venv/bin/python examples/request_reply.py --demo

The server consumes queue ``calc`` (managed by its host) and answers each request on the
request's reply-to destination with the request's correlation id.
"""

from __future__ import annotations

import argparse
import ast
import operator
import sys
import threading

import joms

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expr: str) -> str:
    """Evaluate ``a op b`` for + - * on integers (no eval)."""
    try:
        node = ast.parse(expr, mode="eval").body
        if (
            isinstance(node, ast.BinOp)
            and type(node.op) in _OPS
            and isinstance(node.left, ast.Constant)
            and isinstance(node.right, ast.Constant)
        ):
            return str(_OPS[type(node.op)](int(node.left.value), int(node.right.value)))
    except (SyntaxError, ValueError, TypeError):
        pass
    return "error: use a+b, a-b or a*b"


def serve(
    url: str, queue: str, stop: threading.Event, ready: threading.Event | None = None
) -> None:
    with joms.connect(url) as conn:
        s = conn.create_session()
        requests = s.create_consumer(s.create_queue(queue))
        replies = s.create_producer()
        if ready is not None:
            ready.set()
        while not stop.is_set():
            m = requests.receive(0.2)
            if m is None or m.reply_to is None:
                continue
            assert isinstance(m, joms.TextMessage)
            answer = s.create_text_message(calc(m.text or ""))
            answer.correlation_id = m.correlation_id
            replies.send(answer, m.reply_to)


def ask(url: str, service: str, questions: list[str], timeout: float = 15.0) -> dict[str, str]:
    answers: dict[str, str] = {}
    with joms.connect(url) as conn:
        s = conn.create_session()
        reply_q = s.create_temporary_queue()
        replies = s.create_consumer(reply_q)
        p = s.create_producer(s.create_queue(service))
        for i, q in enumerate(questions):
            m = s.create_text_message(q)
            m.reply_to = reply_q
            m.correlation_id = f"q{i}"
            p.send(m)
        while len(answers) < len(questions):
            r = replies.receive(timeout)
            if r is None:
                break
            assert isinstance(r, joms.TextMessage)
            idx = int((r.correlation_id or "q-1")[1:])
            answers[questions[idx]] = r.text or ""
            print(f"{questions[idx]} = {r.text}", flush=True)
    return answers


def demo() -> dict[str, str]:
    from _demo import loopback_hosts

    with loopback_hosts(2, prefix="rr") as (server_host, client_host):
        stop, ready = threading.Event(), threading.Event()
        t = threading.Thread(target=serve, args=(server_host.stomp_url, "calc", stop, ready))
        t.start()
        ready.wait(10)
        try:
            return ask(client_host.stomp_url, f"calc@{server_host.host_id}", ["1+2", "6*7", "9-10"])
        finally:
            stop.set()
            t.join()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("role", nargs="?", choices=["server", "client"])
    ap.add_argument("questions", nargs="*")
    ap.add_argument("--url", default="stomp://127.0.0.1:61613")
    ap.add_argument("--queue", default="calc")
    ap.add_argument("--service", default="calc")
    ap.add_argument("--demo", action="store_true")
    args = ap.parse_intermixed_args()  # `client --url U --service S 1+2 3*4`, as above
    try:
        if args.demo or args.role is None:
            demo()
        elif args.role == "server":
            stop = threading.Event()
            try:
                serve(args.url, args.queue, stop)
            except KeyboardInterrupt:
                stop.set()
        else:
            ask(args.url, args.service, args.questions or ["1+1"])
    except joms.JMSException as exc:
        print(f"request_reply: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
