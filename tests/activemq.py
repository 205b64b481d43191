"""A private Apache ActiveMQ 5.x broker for differential tests (the Debian ``activemq`` package).

:func:`start_broker` runs ``java -jar /usr/share/activemq/bin/activemq.jar`` with its own base
directory (configuration and KahaDB data under a temporary directory, never the system
instance's), a STOMP connector on a free loopback port, no JMX, no web console, and a
modest heap. When the package is missing it is installed with ``apt-get`` if we are root;
otherwise :class:`Unavailable` says why (tests skip with that reason). A broker that is
installed but does not start fails the tests that need it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from brokers import free_port

HOME = Path("/usr/share/activemq")
JAR = HOME / "bin" / "activemq.jar"

_CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
    http://activemq.apache.org/schema/core
    http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false"
          brokerName="joms-diff" dataDirectory="{data}" persistent="{persistent}"
          schedulePeriodForDestinationPurge="1000">
    <destinationPolicy>
      <policyMap><policyEntries>
        <policyEntry topic=">" expireMessagesPeriod="500"/>
        <policyEntry queue=">" expireMessagesPeriod="500"/>
      </policyEntries></policyMap>
    </destinationPolicy>
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <systemUsage><systemUsage>
      <memoryUsage><memoryUsage limit="64 mb"/></memoryUsage>
      <storeUsage><storeUsage limit="1 gb"/></storeUsage>
      <tempUsage><tempUsage limit="256 mb"/></tempUsage>
    </systemUsage></systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}?transport.closeAsync=false"/>
    </transportConnectors>
  </broker>
</beans>
"""

_LOG4J = """rootLogger.level=WARN
rootLogger.appenderRef.console.ref=Console
appender.console.type=Console
appender.console.name=Console
appender.console.layout.type=PatternLayout
appender.console.layout.pattern=%d %-5p %c{1} - %m%n
"""


class Unavailable(RuntimeError):
    """ActiveMQ cannot be run here (the message says why)."""


@dataclass
class Broker:
    proc: subprocess.Popen[bytes]
    port: int
    base: Path
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ensure_installed() -> None:
    """Install the Debian package when missing (root only); Unavailable otherwise."""
    if JAR.exists() and shutil.which("java"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(
            "ActiveMQ (Debian package 'activemq') is not installed and this test run cannot "
            "install it (needs root and apt-get)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "activemq"]):
        r = subprocess.run(cmd, env=env, capture_output=True, timeout=900)
        if r.returncode != 0:
            raise Unavailable(f"{' '.join(cmd)} failed: {r.stderr.decode()[-500:]}")
    if not JAR.exists():
        raise Unavailable(f"the activemq package did not provide {JAR}")


def _stomp_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            s.settimeout(5)
            return s.recv(64).startswith(b"CONNECTED")
    except OSError:
        return False


def start_broker(base: Path, *, persistent: bool = True, timeout: float = 90.0) -> Broker:
    """Start a broker in ``base`` (created) and wait until its STOMP port answers."""
    ensure_installed()
    conf = base / "conf"
    data = base / "data"
    conf.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (conf / "activemq.xml").write_text(
        _CONFIG.format(data=data, port=port, persistent=str(persistent).lower())
    )
    (conf / "log4j2.properties").write_text(_LOG4J)
    log = base / "activemq.log"
    cmd = [
        shutil.which("java") or "java",
        "-Xms64m",
        "-Xmx256m",
        "-XX:+UseSerialGC",
        f"-Dactivemq.home={HOME}",
        f"-Dactivemq.base={base}",
        f"-Dactivemq.conf={conf}",
        f"-Dactivemq.data={data}",
        f"-Dactivemq.classpath={conf}",
        f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
        "-jar",
        str(JAR),
        "start",
        f"xbean:file:{conf / 'activemq.xml'}",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=base)
    broker = Broker(proc, port, base, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"ActiveMQ exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if _stomp_ready(port):
            return broker
        time.sleep(0.2)
    broker.stop()
    raise Unavailable(
        f"ActiveMQ did not answer STOMP within {timeout} s: {log.read_text()[-2000:]}"
    )


@pytest.fixture(scope="session")
def activemq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One private ActiveMQ per test session. Skips, with the reason, only when the package
    is missing and cannot be installed here; an installed broker that does not start is a
    failure (a skip would hide that the differential suite did not run)."""
    try:
        ensure_installed()
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        broker = start_broker(tmp_path_factory.mktemp("activemq"))
    except Unavailable as exc:
        pytest.fail(f"ActiveMQ is installed but did not start: {exc}")
    yield broker
    broker.stop()
