"""The JOMS service is assembled from JMS's own parts, one module each, and stays sans-IO.

Issue 17 split ``joms/service/service.py`` along topics and durable subscriptions,
acknowledgement and transactions, queue managers, queue receivers and the directory,
keeping the service free of I/O and clocks: every input carries ``now``, state goes
through the :class:`~joms.service.store.ServiceStore` interface (its SQLite
implementation, ``store.py``, is the one module that touches a file).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parent.parent / "joms" / "service"
IO_MODULES = {"asyncio", "socket", "selectors", "threading", "subprocess", "time", "sqlite3",
              "datetime", "os", "ssl", "http", "urllib"}  # fmt: skip
PARTS = {
    "topics": "TopicsMixin",
    "acknowledgement": "AcknowledgementMixin",
    "queue_manager": "QueueManagerMixin",
    "queue_receiver": "QueueReceiverMixin",
    "directory": "DirectoryMixin",
}


def _top_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize(
    "module", sorted(p.stem for p in SERVICE.glob("*.py") if p.stem != "store")
)
def test_the_service_modules_do_no_io_and_read_no_clock(module: str) -> None:
    used = _top_imports(SERVICE / f"{module}.py") & IO_MODULES
    assert not used, f"joms/service/{module}.py imports {sorted(used)}"


def test_the_service_is_its_parts_and_nothing_else() -> None:
    from joms.service import base, service

    bases = [b.__name__ for b in service.JomsService.__mro__[1:-1]]
    assert bases == [*PARTS.values(), "ServiceBase"]
    assert service.JomsService.__mro__[-2] is base.ServiceBase


@pytest.mark.parametrize(("module", "mixin"), sorted(PARTS.items()))
def test_a_part_imports_no_other_part(module: str, mixin: str) -> None:
    tree = ast.parse((SERVICE / f"{module}.py").read_text())
    imported = {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for a in node.names
    }
    others = set(PARTS.values()) - {mixin}
    assert not imported & (others | {"JomsService"}), f"{module} imports {imported & others}"
