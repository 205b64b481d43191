"""The console's view of the daemon through its loopback admin API (docs/admin-api.md).

Owns finding the daemon (``--state-dir``, else ``$DODWAN_STATE_DIR`` or the default
state directory when a daemon runs there): its admin API and, from the same
``admin.json``, its STOMP gateway; and the reads the console needs: status, peers, and the
destinations the network knows (JOMS directory adverts and the destinations of JOMS
messages in the cache).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from dodwan.daemon.client import AdminClient, ClientError, admin_path
from dodwan.daemon.config import default_state_dir

NEEDS_STATE_DIR = (
    "this needs the daemon's admin API: start the console with --state-dir DIR "
    "(the state directory the daemon was started with)"
)
_MAX_ADVERTS = 64


class AdminUnavailable(Exception):
    """The admin API cannot be used; the message says why and what to do."""


class Admin:
    """Reads from the daemon's admin API."""

    def __init__(self, state_dir: str | Path | None) -> None:
        self.state_dir = Path(state_dir) if state_dir else None

    def _where(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        guess = default_state_dir()
        if os.environ.get("DODWAN_STATE_DIR") or (guess / "admin.json").exists():
            return guess
        raise AdminUnavailable(NEEDS_STATE_DIR)

    @property
    def configured(self) -> bool:
        try:
            self._where()
        except AdminUnavailable:
            return False
        return True

    def gateway_url(self) -> str:
        """``stomp://HOST:PORT`` of the STOMP gateway the daemon recorded in admin.json.

        Raises :class:`AdminUnavailable` saying why when there is no daemon or it serves no
        gateway (started without ``--stomp``)."""
        where = self._where()
        self._client()  # a daemon runs there (not a stale admin.json)
        try:
            info = json.loads((where / "admin.json").read_text())
        except (OSError, ValueError) as exc:
            raise AdminUnavailable(f"cannot read {where / 'admin.json'}: {exc}") from None
        stomp = info.get("stomp") if isinstance(info, dict) else None
        if not stomp:
            host = info.get("host_id", "?") if isinstance(info, dict) else "?"
            raise AdminUnavailable(
                f"the daemon of {where} (host {host}) serves no STOMP gateway: restart it "
                "with --stomp 127.0.0.1:61613 (or give the console --url)"
            )
        return f"stomp://{stomp}"

    def explain(self, url: str) -> str | None:
        """Why a gateway ``url`` the user gave may be the wrong one, when the daemon of the
        state directory serves another or none; None when it cannot tell."""
        if not self.configured:
            return None
        try:
            served = self.gateway_url()
        except AdminUnavailable as exc:
            return str(exc) if "serves no STOMP gateway" in str(exc) else None
        given = url if "://" in url else f"stomp://{url}"
        return None if served == given else f"the daemon of {self._where()} serves {served}"

    def _client(self) -> AdminClient:
        try:
            return AdminClient.for_state_dir(self._where(), timeout=5.0)
        except ClientError as exc:
            raise AdminUnavailable(str(exc)) from None

    def _get(self, path: str, client: AdminClient | None = None) -> Any:
        try:
            return (client or self._client()).get(path)
        except ClientError as exc:
            raise AdminUnavailable(str(exc)) from None

    def status(self) -> dict[str, Any]:
        return dict(self._get("/status"))

    def peers(self) -> dict[str, Any]:
        return dict(self._get("/peers"))

    def destinations(self) -> tuple[set[str], set[str]]:
        """(topics, queues) known from the cache: directory adverts and JOMS messages."""
        topics: set[str] = set()
        queues: set[str] = set()
        adverts = 0
        client = self._client()  # one read of admin.json for the listing and every advert
        for item in self._get("/cache", client):
            d = item.get("descriptor", {})
            kind = d.get("jms_kind")
            if kind == "directory" and item.get("complete") and adverts < _MAX_ADVERTS:
                adverts += 1
                try:
                    full = self._get(admin_path("cache", str(item["id"])) + "?payload=1", client)
                    rec = json.loads(base64.b64decode(full.get("payload_b64", "")))
                    topics.update(str(t) for t in rec.get("topics", []))
                    queues.update(str(q) for q in rec.get("queues", []))
                except (AdminUnavailable, ValueError, KeyError, TypeError, AttributeError):
                    continue
            elif kind == "message":
                name = d.get("destination_id")
                if not name:
                    continue
                if d.get("destination_type") == "topic":
                    topics.add(str(name))
                elif d.get("destination_type") == "queue" and not str(name).startswith("tmp."):
                    queues.add(str(name))
        return topics, queues
