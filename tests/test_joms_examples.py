"""The examples run end to end in their --demo mode (in-process loopback hosts)."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def examples_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_chat_demo_delivers_by_language_and_keeps_messages_for_absent_bob() -> None:
    import chat

    got = chat.demo()["bob"]
    assert "[alice] hello bob" in got
    assert "[alice] how are you?" in got
    assert not any("hallo" in line for line in got)  # German is filtered out
    assert not any("salut" in line for line in got)  # no-local: not his own


def test_work_queue_demo_each_job_once_every_worker_used() -> None:
    import work_queue

    res = work_queue.demo(jobs=30)
    assert res["total"] == 30 and res["distinct"] == 30
    assert all(res[f"worker{i}"] >= 1 for i in (1, 2, 3))


def test_request_reply_demo_answers_through_temporary_queue() -> None:
    import request_reply

    assert request_reply.demo() == {"1+2": "3", "6*7": "42", "9-10": "-1"}
