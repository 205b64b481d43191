"""The source trees a before/after bench runs: this checkout, and a baseline revision
checked out in a temporary git worktree for the duration (``--baseline REV``).

When this checkout runs the compiled core, the baseline worktree gets its own native build
(about a minute), so that both sides run compiled: a compiled "ours" against a pure-Python
baseline once made every ratio measure mypyc rather than the change."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _compiled(root: Path) -> bool:
    """Whether the checkout at ``root`` runs the compiled core (``python -m dodwan.native
    status`` there, which honours DODWAN_NATIVE=0)."""
    done = subprocess.run([sys.executable, "-m", "dodwan.native", "status"], cwd=root,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.startswith("compiled core")


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
        if _compiled(ROOT):
            print(f"building the native core of {baseline} (as this checkout runs compiled) ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            subprocess.run([sys.executable, "-m", "dodwan.native", "build"], cwd=tmp,
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            if not _compiled(Path(tmp)):
                raise SystemExit(f"the native build of {baseline} is not usable")
    try:
        yield out
    finally:
        if tmp is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp])
