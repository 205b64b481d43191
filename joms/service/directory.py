"""The directory: adverts of the queues this host manages and the topics it uses, and what
the host knows of the others' (eventually consistent)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import model as mdl
from .base import (
    TEMP_TOPIC_PREFIX,
    ServiceBase,
    _json_obj,
)
from .wildcards import is_wildcard


class DirectoryMixin(ServiceBase):
    # ================================================================ directory
    def _note_topic(self, topic: str, now: float) -> None:
        if topic.startswith(TEMP_TOPIC_PREFIX) or is_wildcard(topic):
            return  # temporary topics and wildcard subscriptions are not advertised
        if topic not in self._topics_here:
            self._topics_here.add(topic)
            self._next_advert = min(self._next_advert or now, now)  # advertise it soon

    def _advertise(self, now: float) -> None:
        queues = sorted(n for n, q in self._queues.items() if not q.temporary)
        topics = sorted(self._topics_here)
        if not queues and not topics:
            return
        try:
            self.port.publish(
                {mdl.KIND: mdl.KIND_DIRECTORY, mdl.DEST_TYPE: "topic", mdl.DEST_ID: "directory"},
                json.dumps({"host": self.host_id, "queues": queues, "topics": topics}).encode(),
                deadline=now + 3 * self.config.directory_period,
                priority=1,
                persistent=False,
            )
        except ValueError:
            self._count("advert_refused")

    def _on_directory(self, d: Mapping[str, str], p: bytes, now: float) -> None:
        rec = _json_obj(p)
        host = d.get("origin", "")
        if not host or host == self.host_id:
            return
        date = float(d.get("date", now))
        old = self._directory.get(host)
        if old is not None and old[0] > date:
            return
        queues = [str(x) for x in rec.get("queues", [])][:1000]
        topics = [str(x) for x in rec.get("topics", [])][:1000]
        self._directory[host] = (date, queues, topics)

    def destinations(self) -> dict[str, list[str]]:
        """What this host knows: ``{"queues": [Name@H…], "topics": [...]}`` (eventually consistent)."""
        queues = {n for n, q in self._queues.items() if not q.temporary}
        topics = set(self._topics_here)
        for _, qs, ts in self._directory.values():
            queues.update(qs)
            topics.update(ts)
        return {"queues": sorted(queues), "topics": sorted(topics)}

    def manages(self, queue: str) -> bool:
        """Whether queue ``Name@H`` is managed here (it exists on this host)."""
        return queue in self._queues

    def lookup_queue(self, name: str) -> list[str]:
        """Known ``Name@H`` for a queue name (local manager first)."""
        hits = [q for q in self.destinations()["queues"] if q.partition("@")[0] == name]
        local = f"{name}@{self.host_id}"
        return sorted(hits, key=lambda q: (q != local, q))

    def queue_status(self, name: str) -> dict[str, Any]:
        """Manager state of a queue managed here (for admin tools and tests)."""
        q = self._queues[name]
        return {
            "receivers": {
                r.reply_id: {"until": r.until, "selector": r.selector_text, "served": r.served}
                for r in q.receivers.values()
            },
            "pending": len(q.pending),
            "assigned": sum(1 for p in q.pending.values() if p.assigned),
        }
