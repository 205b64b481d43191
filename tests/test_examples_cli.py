"""The examples run as their docstrings show, as processes against a real daemon (issue 19):
``.venv/bin/python examples/...`` (here ``sys.executable``, the same interpreter)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_console_terminal import Host
from test_daemon_helpers import random_group

import joms

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = Host(tmp_path_factory.mktemp("examples"), "ex", random_group())
    h.start()
    yield h
    h.daemon.kill()


def example(*args: str, input: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], input=input, capture_output=True, text=True,
        timeout=timeout, cwd=ROOT,
    )  # fmt: skip


def test_docstrings_use_the_virtual_environment() -> None:
    for path in EXAMPLES.glob("[!_]*.py"):
        doc = path.read_text().split('"""')[1]
        runs = re.findall(r"^\s+(\S*python\S*) examples/", doc, re.M)
        assert runs and set(runs) == {".venv/bin/python"}, (path.name, runs)


def test_request_reply_client_as_its_docstring_shows(host: Host) -> None:
    url = f"stomp://{host.url}"
    server = subprocess.Popen(
        [sys.executable, "examples/request_reply.py", "server", "--url", url],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # the line of the docstring: options before the questions
        r = example("examples/request_reply.py", "client", "--url", url, "--service",
                    "calc@ex", "1+2", "3*4")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["1+2 = 3", "3*4 = 12"]
    finally:
        server.terminate()
        server.wait(10)


def test_chat_shows_a_message_without_sender_readably(host: Host) -> None:
    url = f"stomp://{host.url}"
    args = ["examples/chat.py", "--url", url, "--name", "dave", "--room", "NoSender"]
    assert example(*args).returncode == 0  # the durable subscription exists from now on
    with joms.connect(url) as conn:  # like the console: no `sender` property
        s = conn.create_session()
        s.create_producer(s.create_topic("NoSender")).send(
            s.create_text_message("hi all", properties={"language": "English"})
        )
    r = example(*args)
    assert r.returncode == 0, r.stderr
    assert "dave sees [unknown sender] hi all" in r.stdout.splitlines(), r.stdout
    assert "None" not in r.stdout
