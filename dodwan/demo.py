"""A three-host disconnected network in virtual time: the core carrying one message.

Island A (publisher) and island C (subscriber) never meet; carrier B visits A, travels,
then visits C. Run with ``python -m dodwan.demo``; it takes well under a second.
"""

from __future__ import annotations

from .virtual import VirtualNetwork


def main() -> int:
    net = VirtualNetwork(seed=42, loss=0.1)
    for host in ("island-a", "carrier-b", "island-c"):
        net.add(host, altruistic=(host == "carrier-b"), trace=True)

    def say(text: str) -> None:
        print(f"[t={net.now:7.1f}s] {text}")

    key = net.subscribe("island-c", {"topic": "ChatRoom1", "language": "English|French"})
    say("island-c subscribes: topic=ChatRoom1, language=English|French")
    mid = net.publish(
        "island-a",
        {"id": "firstMSG", "topic": "ChatRoom1", "language": "English"},
        b"Hello",
        ttl=3600,
    )
    say(f"island-a publishes {mid!r} (payload 'Hello'); nobody is in range")
    net.run(60)
    net.link("island-a", "carrier-b")
    say("carrier-b comes into range of island-a")
    net.run(30)
    carried = [c["id"] for c in net.node("carrier-b").cache_listing()]
    say(f"carrier-b now carries {carried}")
    net.unlink("island-a", "carrier-b")
    say("carrier-b leaves island-a and travels for ten minutes")
    net.run(600)
    net.link("carrier-b", "island-c")
    say("carrier-b comes into range of island-c")
    net.run(30)
    deliveries = net.deliveries("island-c")
    for d in deliveries:
        say(
            f"island-c received {d.descriptor['id']!r} on subscription {d.subscription} "
            f"from {d.descriptor['origin']}: {d.payload.decode()!r}"
        )
    ok = [d.descriptor["id"] for d in deliveries] == [mid] and deliveries[0].subscription == key
    sent = sum(net.transmissions.values())
    say(f"{sent} datagrams were transmitted in all (10% of receptions were lost)")
    print("OK: store, carry and forward delivered the message" if ok else "FAILED: not delivered")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
