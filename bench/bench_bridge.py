"""Bridge throughput to each broker on loopback, in messages per second.

For each protocol a private broker (the Debian package, started as the tests do, see
tests/brokers.py) and one ``dodwan daemon``:

* out: N messages are published on the daemon first; then a binding is added, the core
  hands it the N cached messages at once, and we time until the broker has confirmed all
  of them (the binding's ``sent_total``): outbox -> broker, batches of 64, each confirmed
  (MQTT QoS 2 / STOMP transaction with receipt / AMQP transaction);
* in: an inbound binding is connected, then a client publishes N messages to the broker
  destination and we time until the daemon has published all of them in DoDWAN (the
  binding's ``received_total``): broker -> DoDWAN, each acknowledged after its commit.

Usage: .venv/bin/python bench/bench_bridge.py [--n 2000] [--size 256] [--only mqtt,stomp,amqp]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bridge_remotes import AmqpRemote, MqttRemote, StompRemote
from brokers import ActiveMQ, Broker, Mosquitto, RabbitMQ
from test_daemon_helpers import DaemonProc, random_group

BROKERS: dict[str, type[Broker]] = {"mqtt": Mosquitto, "stomp": ActiveMQ, "amqp": RabbitMQ}


def wait(pred: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("bench step timed out")
        time.sleep(0.01)


def binding(d: DaemonProc, name: str) -> dict[str, Any]:
    return next(b for b in d.client().get("/bridges") if b["name"] == name)


def uris(proto: str, broker: Broker, topic: str) -> str:
    if proto == "mqtt":
        return broker.url(f"{topic}/#")
    if proto == "stomp":
        return broker.url(f"queue/{topic}")
    return broker.url(f"ex-{topic}/{topic}")


def remote(proto: str, broker: Broker, topic: str) -> Any:
    if proto == "mqtt":
        return MqttRemote(broker.port, f"{topic}/#")
    if proto == "stomp":
        return StompRemote(broker.port, f"/queue/{topic}")
    return AmqpRemote(broker.port, f"ex-{topic}", topic)


def bulk_publish(proto: str, broker: Broker, topic: str, n: int, body: bytes) -> None:
    """Headquarters sends n messages as fast as its client allows."""
    if proto == "mqtt":
        r = MqttRemote(broker.port, "unused/#")
        infos = []
        for _ in range(n):
            infos.append(r.client.publish(topic, body, qos=1))
            if len(infos) >= 200:
                infos.pop(0).wait_for_publish(30)
        for info in infos:
            info.wait_for_publish(30)
        r.close()
    elif proto == "stomp":
        import stomp

        conn = stomp.Connection12([("127.0.0.1", broker.port)], auto_decode=False)
        conn.connect(wait=True)
        for i in range(n):
            conn.send(f"/queue/{topic}", body, headers={"n": str(i)})
        conn.disconnect(receipt="bye")
    else:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        ch = conn.channel()
        ch.exchange_declare(f"ex-{topic}", exchange_type="topic", durable=True)
        for i in range(n):
            ch.basic_publish(
                f"ex-{topic}", topic, body, properties=pika.BasicProperties(message_id=f"m{i}")
            )
        conn.close()


def run(proto: str, root: Path, n: int, size: int) -> tuple[float, float]:
    broker = BROKERS[proto](root / proto)
    if isinstance(broker, Mosquitto):
        broker.save_on_changes = False  # a save per message would measure the disk
    broker.start()
    d = DaemonProc(
        root / f"gw-{proto}",
        ["--group", random_group(), "--cache-capacity", str(1 << 30), "--log-level", "warning"],
    )
    try:
        d.start()
        c = d.client()
        body = os.urandom(size // 2).hex().encode()
        for i in range(n):
            c.post("/publish", {"attributes": {"topic": "out", "n": str(i)}, "text": body.decode()})
        hq = remote(proto, broker, "out")
        t0 = time.perf_counter()
        c.post(
            "/bridges",
            {
                "uri": uris(proto, broker, "out"),
                "name": "out",
                "direction": "out",
                "attributes": {"topic": "out"},
            },
        )
        wait(lambda: binding(d, "out")["sent_total"] >= n, 600)
        out_rate = n / (time.perf_counter() - t0)
        wait(lambda: len(hq.dodwan_ids()) >= n, 120)
        hq.close()

        c.post(
            "/bridges",
            {
                "uri": uris(proto, broker, "in"),
                "name": "in",
                "direction": "in",
                "attributes": {"topic": "in"},
            },
        )
        wait(lambda: binding(d, "in")["connected"], 60)
        t0 = time.perf_counter()
        bulk_publish(proto, broker, "in", n, body)
        wait(lambda: binding(d, "in")["received_total"] >= n, 600)
        in_rate = n / (time.perf_counter() - t0)
        return out_rate, in_rate
    finally:
        d.kill()
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--only", default="mqtt,stomp,amqp")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
        print(f"{args.n} messages of {args.size} bytes, one daemon, private brokers on loopback")
        print(f"{'protocol':<8} {'broker':<10} {'out msg/s':>10} {'in msg/s':>10}")
        for proto in args.only.split(","):
            with contextlib.suppress(KeyboardInterrupt):
                out_rate, in_rate = run(proto, Path(tmp), args.n, args.size)
                name = BROKERS[proto].name
                print(f"{proto:<8} {name:<10} {out_rate:>10.0f} {in_rate:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
