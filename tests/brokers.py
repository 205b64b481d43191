"""Private broker instances for the bridge tests: Mosquitto, RabbitMQ, ActiveMQ.

Each broker runs from its Debian package as a private process of the test session: its own
data directory and configuration under a temporary directory, free loopback ports, never
the system service. Fixtures are session-scoped (RabbitMQ and ActiveMQ take seconds to
start). A test may ``stop()`` and ``start()`` a broker (the uplink cut) — data survives, the
port stays the same. When a package is missing it is installed with apt-get if we run as
root; otherwise the tests using it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGES = {
    "mosquitto": ("mosquitto", "/usr/sbin/mosquitto"),
    "rabbitmq": ("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server"),
    "activemq": ("activemq", "/usr/share/activemq/bin/activemq.jar"),
}


_ports = random.Random()  # seeded from the OS: each test worker draws its own ports


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out as source ports of outgoing connections."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return lo, hi


def free_port() -> int:
    """A loopback port nothing listens on, for a server started later. Drawn outside the
    kernel's ephemeral range: a port bound to 0 and released is an ephemeral one, which any
    connection made meanwhile (the other test worker's, or a readiness probe's own) may take
    as its source port before the server binds it; RabbitMQ, seconds to boot, then failed
    with ``eaddrinuse``."""
    lo, hi = _ephemeral_range()
    candidates = range(10000, lo) if lo > 11000 else range(hi + 1, 65536)
    for _ in range(200):
        port = _ports.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # that range is crowded: any free port will do
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def ensure_package(name: str) -> str:
    """The broker's executable path, installing the package when root; else skip."""
    package, path = PACKAGES[name]
    if os.path.exists(path):
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{package} is not installed and we are not root to apt-get it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", package],
    ):
        rc = subprocess.run(cmd, env=env, capture_output=True, timeout=900)
        if rc.returncode != 0:
            pytest.skip(f"{' '.join(cmd)} failed: {rc.stderr.decode()[-300:]}")
    if not os.path.exists(path):
        pytest.skip(f"the {package} package did not provide {path}")
    return path


class Broker:
    """A broker process started and stopped by the tests (same port, same data)."""

    name = "broker"
    start_timeout = 60.0

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "broker.log"

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def ready(self) -> bool:
        return port_open(self.port)

    def start(self) -> None:
        cmd, env = self.command()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=self.root,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop cleanly (SIGTERM to the process group), SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.monotonic() + 10
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Children (epmd, a JVM's helpers) of the session go with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Mosquitto(Broker):
    name = "mosquitto"
    start_timeout = 15.0
    save_on_changes = True

    def command(self) -> tuple[list[str], dict[str, str]]:
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        conf = self.root / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {data}/\n"
            # Saved after every change: with a periodic save instead, a stop lost QoS 2
            # messages it had acknowledged (see docs/bridges.md). The bench turns it off.
            "autosave_interval 1\n"
            f"autosave_on_changes {'true' if self.save_on_changes else 'false'}\n"
            "max_queued_messages 100000\n"
            "log_dest stderr\n"
            # Run as root, mosquitto would drop to user mosquitto, who cannot write here.
            f"user {getpass.getuser()}\n"
        )
        return [PACKAGES["mosquitto"][1], "-c", str(conf)], {}

    def url(self, path: str) -> str:
        return f"mqtt://127.0.0.1:{self.port}/{path}"


class MosquittoAcl(Mosquitto):
    """Mosquitto with access control: user alice (password secret) may use ``open/#`` and
    her ledger topics, not ``denied/#``; anonymous clients (the tests' remotes) anything."""

    name = "mosquitto"

    def command(self) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command()
        conf = self.root / "mosquitto.conf"
        passwords = self.root / "passwords"
        subprocess.run(
            ["mosquitto_passwd", "-b", "-c", str(passwords), "alice", "secret"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        acl = self.root / "acl"
        acl.write_text(
            "topic readwrite #\n"  # anonymous
            "user alice\n"
            "topic readwrite open/#\n"
            "topic readwrite dodwan-ledger/#\n"
        )
        conf.write_text(conf.read_text() + f"password_file {passwords}\nacl_file {acl}\n")
        return cmd, env


class RabbitMQ(Broker):
    """RABBITMQ_NODENAME, MNESIA_BASE, LOG_BASE, its ports and epmd's all private."""

    name = "rabbitmq"
    start_timeout = 120.0

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"dodwantest{os.getpid()}@localhost"

    def env(self) -> dict[str, str]:
        conf = self.root / "rabbitmq"
        (self.root / "home").mkdir(exist_ok=True)
        plugins = self.root / "enabled_plugins"
        plugins.write_text("[].\n")
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            "vm_memory_high_watermark.relative = 0.2\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        return {
            "HOME": str(self.root / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_CONFIG_FILE": str(conf),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(self.root / "rabbit.pid"),
            "RABBITMQ_SERVER_ERL_ARGS": "+S 1:1 +A 4",
            "RABBITMQ_CTL_ERL_ARGS": "",
        }

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [PACKAGES["rabbitmq"][1]], self.env()

    def ready(self) -> bool:
        # The port opens before the node accepts AMQP handshakes only briefly; a connection
        # that gets the protocol header back is ready.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                s.settimeout(2)
                return s.recv(1) == b"\x01"  # a Connection.Start method frame
        except OSError:
            return False

    def stop(self) -> None:
        super().stop()
        # epmd was started on our private port; it lives outside the process group.
        subprocess.run(
            ["epmd", "-port", str(self.epmd_port), "-kill"],
            env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)},
            capture_output=True,
            timeout=10,
            check=False,
        )

    def url(self, path: str) -> str:
        return f"amqp://127.0.0.1:{self.port}/{path}"


class ActiveMQ(Broker):
    """Only a STOMP connector, no JMX or web console; KahaDB in the private data dir."""

    name = "activemq"
    start_timeout = 120.0

    def command(self) -> tuple[list[str], dict[str, str]]:
        base = self.root
        (base / "conf").mkdir(exist_ok=True)
        (base / "data").mkdir(exist_ok=True)
        (base / "tmp").mkdir(exist_ok=True)
        xml = base / "conf" / "activemq.xml"
        xml.write_text(
            '<beans xmlns="http://www.springframework.org/schema/beans" '
            'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            'xsi:schemaLocation="http://www.springframework.org/schema/beans '
            "http://www.springframework.org/schema/beans/spring-beans-2.0.xsd "
            "http://activemq.apache.org/schema/core "
            'http://activemq.apache.org/schema/core/activemq-core.xsd">\n'
            '<broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" '
            f'brokerName="dodwantest" dataDirectory="{base}/data" schedulerSupport="false">\n'
            f'<persistenceAdapter><kahaDB directory="{base}/data/kahadb"/></persistenceAdapter>\n'
            '<systemUsage><systemUsage><storeUsage><storeUsage limit="200 mb"/></storeUsage>'
            '<tempUsage><tempUsage limit="100 mb"/></tempUsage></systemUsage></systemUsage>\n'
            "<transportConnectors>"
            f'<transportConnector name="stomp" uri="stomp://127.0.0.1:{self.port}"/>'
            "</transportConnectors>\n"
            "</broker></beans>\n"
        )
        home = "/usr/share/activemq"
        cmd = [
            shutil.which("java") or "/usr/bin/java",
            "-Xms64M",
            "-Xmx256M",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dactivemq.classpath={base}/conf",
            f"-Dactivemq.home={home}",
            f"-Dactivemq.base={base}",
            f"-Dactivemq.conf={base}/conf",
            f"-Dactivemq.data={base}/data",
            f"-Djava.io.tmpdir={base}/tmp",
            "-jar",
            f"{home}/bin/activemq.jar",
            "start",
            f"xbean:file:{xml}",
        ]
        return cmd, {}

    def url(self, path: str) -> str:
        return f"stomp://127.0.0.1:{self.port}/{path}"


def _session_broker(
    cls: type[Broker], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    ensure_package(cls.name)
    broker = cls(tmp_path_factory.mktemp(cls.name))
    try:
        broker.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _session_broker(Mosquitto, tmp_path_factory)


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _session_broker(RabbitMQ, tmp_path_factory)


@pytest.fixture(scope="session")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _session_broker(ActiveMQ, tmp_path_factory)


def restart(broker: Broker) -> None:
    """Start a stopped broker again (same port, same data), if a test left it stopped."""
    if not broker.running:
        broker.start()


@pytest.fixture(scope="session")
def mosquitto_acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _session_broker(MosquittoAcl, tmp_path_factory)
