"""The class-data archive of Spark's classes (sim.analysis.class_archive): written once by
one JVM, moved into place only when complete, then mapped by the next JVMs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sim.analysis import class_archive as ca


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DODWAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DODWAN_SPARK_CDS", raising=False)
    return tmp_path / "cache" / "spark-cds"


def _jars(tmp_path: Path) -> Path:
    jars = tmp_path / "jars"
    jars.mkdir(exist_ok=True)
    (jars / "a.jar").write_bytes(b"a")
    return jars


def test_one_writer_then_every_jvm_maps_the_complete_archive(cache: Path, tmp_path: Path) -> None:
    jars = _jars(tmp_path)
    first = ca.plan(jars)
    assert first.writing is not None and first.final is not None
    assert first.options.startswith(f"-XX:ArchiveClassesAtExit={first.writing} ")
    assert first.writing.parent == cache and first.final.parent == cache
    # another process starting meanwhile neither writes nor maps anything
    assert ca.plan(jars).options == ""
    first.writing.write_bytes(ca.MAGIC + b"\0" * 64)  # what the JVM leaves at exit
    assert ca.promote(first.writing, first.final)
    assert not first.writing.exists() and not first.final.with_suffix(".writing").exists()
    again = ca.plan(jars)
    assert again.writing is None
    assert again.options.startswith(f"-XX:SharedArchiveFile={first.final} ")


def test_an_incomplete_archive_is_dropped_and_written_again(cache: Path, tmp_path: Path) -> None:
    """A JVM maps what it is given: a truncated archive crashed it (SIGBUS), so only a file
    whose header the JVM wrote (last) is moved into place."""
    jars = _jars(tmp_path)
    first = ca.plan(jars)
    assert first.writing is not None and first.final is not None
    first.writing.write_bytes(b"\0" * 4096)  # the JVM was killed while writing
    assert not ca.promote(first.writing, first.final)
    assert not first.final.exists() and not first.writing.exists()
    assert ca.plan(jars).writing is not None  # the claim was freed: the next JVM writes it


def test_an_abandoned_claim_is_taken_over(cache: Path, tmp_path: Path) -> None:
    jars = _jars(tmp_path)
    first = ca.plan(jars)
    assert first.final is not None
    assert ca.plan(jars).options == ""
    claim = first.final.with_suffix(".writing")
    old = time.time() - ca.CLAIM_STALE_S - 60
    os.utime(claim, (old, old))
    assert ca.plan(jars).writing is not None


def test_other_spark_jars_get_their_own_archive(tmp_path: Path) -> None:
    jars = _jars(tmp_path)
    java = tmp_path / "java"
    java.write_bytes(b"x")
    key = ca.archive_key(java, jars)
    assert ca.archive_key(java, jars) == key
    (jars / "a.jar").write_bytes(b"ab")  # another Spark build
    assert ca.archive_key(java, jars) != key


def test_turned_off(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DODWAN_SPARK_CDS", "0")
    assert ca.plan(_jars(tmp_path)) == ca.ArchivePlan("")
    assert not cache.exists()


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on the PATH")
def test_a_real_jvm_writes_an_archive_that_the_next_jvm_maps(cache: Path) -> None:
    """The options are the JVM's (a bad -Xlog selection would stop Spark from starting), the
    archive it writes passes the completeness check, and the next JVM loads classes from it."""
    first = ca.plan()
    assert first.writing is not None and first.final is not None
    done = subprocess.run(
        ["java", *first.options.split(), "-version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert ca.promote(first.writing, first.final)
    use = ca.plan()
    assert use.options.startswith("-XX:SharedArchiveFile=")
    shown = subprocess.run(
        ["java", *use.options.split(), "-Xlog:class+load=info", "-version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "source: shared objects file (top)" in shown.stdout
