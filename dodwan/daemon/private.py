"""Owner-only files and directories of the daemon's state (``docs/security.md``, "Files").

The state directory holds every cached payload, the bridges' broker credentials and the
admin token: other local users must read none of them, whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_sqlite(path: Path) -> None:
    """Make the SQLite database ``path`` owner-only before it is opened: when missing, made
    as an empty database of mode 0600 (in WAL mode, so it is not an empty file, which the
    daemon's stores refuse as damaged); when it exists, it and its side files (``-wal``,
    ``-shm``, ``-journal``) made 0600 (files of an earlier version, made under the umask).
    SQLite creates a database's side files with the database's own mode, so a database that
    is 0600 first never has a readable write-ahead log; changing its mode after
    ``journal_mode=WAL`` is too late, the log already exists. A path that is not a regular
    file is left for the opener to refuse with its own message."""
    if not os.path.lexists(path):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
        try:
            conn = sqlite3.connect(str(tmp))
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):  # made meanwhile: that one is kept
                os.link(tmp, path)
        finally:
            for name in sqlite_side_files(tmp):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
    for name in sqlite_side_files(path):
        private_file(name)


def sqlite_side_files(path: Path) -> list[Path]:
    """``path`` and the files SQLite keeps beside it."""
    return [path, *(Path(f"{path}{s}") for s in ("-wal", "-shm", "-journal"))]


def private_file(path: Path) -> None:
    """``path`` made mode 0600 if it is a regular file (nothing if it is missing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
        os.chmod(path, FILE_MODE)


def private_dir(path: Path) -> int | None:
    """Create the directory ``path`` (and missing parents) with mode 0700 for the last. An
    existing one keeps its mode: returned when other users may enter or list it (its files
    are 0600 anyway, but their names show), for the caller to warn about; else None. A file
    of that name raises :class:`FileExistsError`, as ``mkdir`` does."""
    try:
        path.mkdir(mode=DIR_MODE, parents=True)
    except FileExistsError:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise
        return stat.S_IMODE(st.st_mode) if st.st_mode & 0o077 else None
    os.chmod(path, DIR_MODE)  # whatever the umask
    return None
