"""The source trees a before/after bench runs: this checkout, and a baseline revision
checked out in a temporary git worktree for the duration (``--baseline REV``)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def trees(baseline: str | None) -> Iterator[list[tuple[str, Path]]]:
    """``[("ours", ROOT)]``, plus ``(baseline, worktree)`` when a revision is given; the
    worktree is removed on exit."""
    out = [("ours", ROOT)]
    tmp = None
    if baseline:
        tmp = tempfile.mkdtemp(prefix="dodwan-baseline-")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", tmp,
                        baseline], check=True)  # fmt: skip
        out.append((baseline, Path(tmp)))
    try:
        yield out
    finally:
        if tmp is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp])
