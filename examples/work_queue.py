"""A work queue with competing workers: each job is done once, by one of the workers.

    .venv/bin/python examples/work_queue.py producer --url stomp://127.0.0.1:61613 --queue jobs --count 20
    .venv/bin/python examples/work_queue.py worker --url stomp://OTHER:61613 --queue jobs@HOST --name w1
    .venv/bin/python examples/work_queue.py --demo   # a manager host and three worker hosts in-process

The host the producer talks to manages queue ``jobs`` (``jobs@HOST``); workers anywhere
address it by that name. The manager hands each job to one worker, round-robin.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading

import joms


def produce(url: str, queue: str, count: int) -> None:
    with joms.connect(url) as conn:
        s = conn.create_session()
        p = s.create_producer(s.create_queue(queue))
        for i in range(count):
            p.send(s.create_text_message(f"job {i}", properties={"n": i}))


def work(
    url: str, queue: str, name: str, stop: threading.Event, done: list[tuple[str, str]]
) -> None:
    with joms.connect(url) as conn:
        s = conn.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        c = s.create_consumer(s.create_queue(queue))
        while not stop.is_set():
            m = c.receive(0.2)
            if m is None:
                continue
            assert isinstance(m, joms.TextMessage)
            done.append((name, m.text or ""))
            print(f"{name} did {m.text}", flush=True)
            m.acknowledge()


def demo(jobs: int = 30) -> dict[str, int]:
    from _demo import loopback_hosts

    with loopback_hosts(4, prefix="wq") as hosts:
        manager = hosts[0]
        queue = f"jobs@{manager.host_id}"
        stop = threading.Event()
        done: list[tuple[str, str]] = []
        workers = [
            threading.Thread(target=work, args=(h.stomp_url, queue, f"worker{i}", stop, done))
            for i, h in enumerate(hosts[1:], 1)
        ]
        for w in workers:
            w.start()
        # give the manager time to hear the three receiver requests
        import time

        time.sleep(1.5)
        produce(hosts[1].stomp_url, queue, jobs)
        deadline = time.monotonic() + 30
        while len(done) < jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for w in workers:
            w.join()
        per = collections.Counter(n for n, _ in done)
        print(f"{len(done)} jobs done: {dict(per)}")
        return dict(per) | {"total": len(done), "distinct": len({j for _, j in done})}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("role", nargs="?", choices=["producer", "worker"])
    ap.add_argument("--url", default="stomp://127.0.0.1:61613")
    ap.add_argument("--queue", default="jobs")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--name", default="worker")
    ap.add_argument("--demo", action="store_true")
    args = ap.parse_args()
    try:
        if args.demo or args.role is None:
            demo()
        elif args.role == "producer":
            produce(args.url, args.queue, args.count)
        else:
            stop = threading.Event()
            try:
                work(args.url, args.queue, args.name, stop, [])
            except KeyboardInterrupt:
                stop.set()
    except joms.JMSException as exc:
        print(f"work_queue: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
