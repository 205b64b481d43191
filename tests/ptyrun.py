"""Run a command on a pseudo-terminal of its own and collect what it wrote: for the
tests of what reaches a real terminal (rich draws otherwise on a terminal than on a pipe).

Not a test module itself: ``test_top.py`` and ``test_sim_cli.py`` import it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_in_pty(cmd: list[str], timeout: float = 30.0, cwd: str | None = None) -> tuple[int, str]:
    """Run ``cmd`` on a 250-column pseudo-terminal; its exit status and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 250, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave,
                            env={**env, "TERM": "xterm"}, cwd=cwd)  # fmt: skip
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other end closed: the command exited
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, out.decode("utf-8", "replace")
