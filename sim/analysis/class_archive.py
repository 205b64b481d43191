"""A class-data-sharing archive of Spark's classes for the short-lived local JVMs of small
analyses: the JVM options that map it, or that have the JVM write it when it exits.

A small run's analysis spends much of its JVM time loading, parsing and verifying Spark's
classes from ~280 jars. A dynamic CDS archive (``-XX:ArchiveClassesAtExit``, JDK 13+) keeps
the classes a JVM loaded pre-parsed and pre-verified in one mapped file; the next JVM loads
them from there (measured on the quickstart run: docs/performance.md).

The archive is written once, by the first small analysis' JVM: when that Python process
exits, it stops the JVM and waits for it to write the archive (≈ 190 MB; 30 s more at exit
on this loaded 2-core machine, once), then
moves the complete file into place — a JVM must never map a partly written archive (a
truncated one crashes it). It lives under ``$DODWAN_CACHE`` or ``~/.cache/dodwan`` and is
keyed by the Java runtime and the Spark jars, so another JDK or Spark version writes its
own; the JVM itself also checks the class path and every jar's size and time, and runs
without the archive when they do not match. ``DODWAN_SPARK_CDS=0`` turns it off.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

CLAIM_STALE_S = 1800.0
"""A writer's claim older than this is taken as abandoned (its process was killed)."""

WRITE_TIMEOUT_S = 300.0
"""How long an exiting process waits for its JVM to write the archive."""

MAGIC = bytes.fromhex("a8ab0bf0")
"""First bytes of a dynamic CDS archive (JDK's CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian):
the JVM writes the header last, so a file that starts with them is complete."""

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""No CDS messages on the console (a mismatching archive is simply not used)."""


@dataclass(frozen=True)
class ArchivePlan:
    """What a new local JVM does with the archive."""

    options: str
    """JVM options ("" = no archive)."""
    writing: Path | None = None
    """Where this JVM writes the archive at exit (then moved to ``final``), if it does."""
    final: Path | None = None
    """The archive's path."""


def cache_dir() -> Path:
    """Where the archive lives: $DODWAN_CACHE/spark-cds, else ~/.cache/dodwan/spark-cds."""
    root = os.environ.get("DODWAN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dodwan"
    )
    return Path(root) / "spark-cds"


def _java() -> Path | None:
    """The java binary spark-submit starts (JAVA_HOME first, then the PATH), resolved."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def archive_key(java: Path, jars: Path) -> str:
    """Identifies a (Java runtime, Spark jars) pair by the paths, sizes and times of both."""
    h = hashlib.sha256()
    for f in [java, *sorted(jars.glob("*.jar"))]:
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def plan(jars: Path | None = None) -> ArchivePlan:
    """The archive's part in a small analysis' JVM options: map the archive when it exists;
    else write it at exit if no other process claimed that; else nothing. Nothing either when
    turned off (DODWAN_SPARK_CDS=0) or when the cache directory is not writable."""
    if os.environ.get("DODWAN_SPARK_CDS", "1") == "0":
        return ArchivePlan("")
    java = _java()
    jars = jars or Path(pyspark.__file__).parent / "jars"
    if java is None or not jars.is_dir():
        return ArchivePlan("")
    final = cache_dir() / f"spark-{archive_key(java, jars)}.jsa"
    claim = final.with_suffix(".writing")
    if final.is_file():
        return ArchivePlan(f"-XX:SharedArchiveFile={final} {_QUIET}", final=final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if not _claim(claim):
            return ArchivePlan("")
    except OSError:
        return ArchivePlan("")
    writing = final.with_suffix(f".{os.getpid()}.part")
    return ArchivePlan(f"-XX:ArchiveClassesAtExit={writing} {_QUIET}", writing, final)


def _claim(claim: Path) -> bool:
    """True if this process may write the archive (no other writer claimed it recently)."""
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if time.time() - claim.stat().st_mtime < CLAIM_STALE_S:
            return False
        claim.unlink(missing_ok=True)  # abandoned: claim it again
        return _claim(claim)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def promote(writing: Path, final: Path) -> bool:
    """Move a completely written archive into place; drop an incomplete one. Frees the claim."""
    try:
        with writing.open("rb") as f:
            complete = f.read(len(MAGIC)) == MAGIC
        if complete:
            os.replace(writing, final)
        return complete
    except OSError:
        return False
    finally:
        writing.unlink(missing_ok=True)
        final.with_suffix(".writing").unlink(missing_ok=True)


def write_at_exit(spark: SparkSession, archive: ArchivePlan) -> None:
    """When this process exits: stop the session, let its JVM exit and write the archive,
    then promote it. Only for a JVM this process started with ``archive.writing``."""
    proc: subprocess.Popen[bytes] | None = getattr(spark.sparkContext._gateway, "proc", None)
    writing, final = archive.writing, archive.final
    if proc is None or writing is None or final is None:
        return

    def finish() -> None:
        print(
            f"writing the class-data archive of Spark's classes to {final.parent} "
            "(once; later analyses start faster) ...",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(Exception):
            spark.stop()
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.close()  # the gateway exits on end of input
        try:
            proc.wait(timeout=WRITE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # still writing: never promote a partial archive
            proc.kill()
            proc.wait()
            writing.unlink(missing_ok=True)
            final.with_suffix(".writing").unlink(missing_ok=True)
            return
        promote(writing, final)

    atexit.register(finish)
