"""One boto3 client per store, built in the process that uses it, with every wait bounded:
connect and read timeouts, retries in the standard mode, and a deadline over all attempts
of one request (`S3Limits`, from the environment)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from keygroups.errors import StorageError


@dataclass(frozen=True)
class S3Limits:
    """How long one S3 request may wait, so a frozen endpoint fails a job in about a
    minute instead of hanging it (botocore's defaults, 60 s reads and up to 10 attempts,
    add up to ten minutes and more).

    botocore has no standard variable for its timeouts, so these come from
    ``KEYFILL_S3_CONNECT_TIMEOUT``, ``KEYFILL_S3_READ_TIMEOUT`` and ``KEYFILL_S3_DEADLINE``
    (seconds); attempts and retry mode come from the standard ``AWS_MAX_ATTEMPTS`` /
    ``AWS_RETRY_MODE`` or the AWS config file. The read timeout bounds each wait for bytes,
    not a whole transfer, so large GETs are not cut short.
    """

    connect_s: float = 5.0
    read_s: float = 20.0
    deadline_s: float = 60.0  # no retry starts that could not finish within this (+1 s per MiB sent)

    ENV = {
        "connect_s": "KEYFILL_S3_CONNECT_TIMEOUT",
        "read_s": "KEYFILL_S3_READ_TIMEOUT",
        "deadline_s": "KEYFILL_S3_DEADLINE",
    }

    @classmethod
    def from_env(cls) -> S3Limits:
        values: dict[str, float] = {}
        for name, var in cls.ENV.items():
            raw = os.environ.get(var)
            if raw is None or not raw.strip():
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise StorageError(f"{var}={raw!r}: expected a number of seconds") from None
            if not 0 < values[name] < 86_400:
                raise StorageError(f"{var}={raw!r}: must be more than 0 seconds and less than a day")
        limits = cls(**values)
        if limits.deadline_s <= limits.read_s:
            raise StorageError(
                f"{cls.ENV['deadline_s']}={limits.deadline_s:g} must exceed {cls.ENV['read_s']}={limits.read_s:g}: "
                "otherwise no request could ever be retried"
            )
        return limits


DEFAULT_MAX_ATTEMPTS = 5


def _deadline_hooks(events: Any, limits: S3Limits) -> None:
    """Give every S3 request a total deadline across botocore's retries.

    botocore bounds each attempt (timeouts) and the number of attempts, but not their sum;
    a hook before each send refuses a retry that could not finish in time, naming the last
    error, and the request fails with that instead of waiting out every attempt.
    """
    from botocore.exceptions import BotoCoreError

    class DeadlineExceeded(BotoCoreError):
        fmt = "gave up after {elapsed:.0f} s and {attempts} attempt(s) on endpoint {endpoint}: {last}"

    def before_send(request: Any, **_: Any) -> None:
        ctx = request.context
        now = time.monotonic()
        started = ctx.setdefault("keyfill_started", now)
        attempt = ctx.get("retries", {}).get("attempt", 1)
        # A request with a body (a PUT, a multipart part) may spend its time sending: allow
        # one more second per MiB, so a slow upload keeps its retries.
        sent = int(request.headers.get("Content-Length") or 0)
        if attempt > 1 and now - started + limits.read_s > limits.deadline_s + sent / (1 << 20):
            endpoint = urlparse(request.url)
            raise DeadlineExceeded(
                elapsed=now - started,
                attempts=attempt - 1,
                endpoint=f"{endpoint.scheme}://{endpoint.netloc}",
                last=ctx.get("keyfill_last_error", "no answer"),
            )

    def needs_retry(request_dict: Any, response: Any = None, caught_exception: Any = None, **_: Any) -> None:
        if caught_exception is not None:
            request_dict["context"]["keyfill_last_error"] = str(caught_exception)
        elif response is not None:
            err = response[1].get("Error", {}) if isinstance(response[1], dict) else {}
            if err:
                request_dict["context"]["keyfill_last_error"] = f"{err.get('Code')} {err.get('Message', '')}".strip()
        return None  # the decision stays botocore's

    events.register_first("before-send.s3", before_send)
    events.register_first("needs-retry.s3", needs_retry)


_CLIENTS: dict[tuple, Any] = {}  # per process: (threads, limits, AWS_* environment) -> client
_CLIENTS_LOCK = threading.Lock()


class S3Client:
    """One boto3 client, created on first use and shared by a store and its sub() stores.

    boto3 clients are thread-safe but hold sockets and locks, so pickling keeps only the
    settings, and a copy (in a Spark worker) gets its client when first used: the one
    this process already made for copies with the same settings and AWS environment, if
    any. A client takes 150-200 ms to build; Spark reuses a Python worker for many tasks,
    and each task unpickles its own store.
    """

    def __init__(self, threads: int, *, copied: bool = False) -> None:
        self.threads = threads
        self.copied = copied
        self._client: Any = None
        self._lock = threading.Lock()
        self.limits = S3Limits.from_env()

    def get(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._shared() if self.copied else self._make()
                client = self._client
        return client

    def _shared(self) -> Any:
        """This process's client for these settings and the AWS_* environment they were read in."""
        key = (self.threads, self.limits, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._make()
        return client

    def _make(self) -> Any:
        import boto3
        import botocore.session
        from botocore.config import Config

        # Endpoint (AWS_ENDPOINT_URL[_S3]), credentials and profile come from botocore's
        # usual chain; we only fill in what it would otherwise get wrong for us.
        core = botocore.session.get_session()
        mode = core.get_config_variable("retry_mode")
        config = Config(
            region_name=core.get_config_variable("region") or "us-east-1",
            retries={
                # 'legacy' (botocore's default) gives up after 4 attempts on throttling.
                "mode": mode if mode in ("standard", "adaptive") else "standard",
                "total_max_attempts": core.get_config_variable("max_attempts") or DEFAULT_MAX_ATTEMPTS,
            },
            connect_timeout=self.limits.connect_s,
            read_timeout=self.limits.read_s,
            # Read-ahead keeps more GETs in flight than there are threads.
            max_pool_connections=max(10, 2 * self.threads),
        )
        client = boto3.session.Session(botocore_session=core).client("s3", config=config)
        _deadline_hooks(client.meta.events, self.limits)
        return client

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"], copied=True)
