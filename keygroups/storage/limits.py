"""How long one request to an object store may wait, the same bound on every store.

A frozen endpoint must fail a job in about a minute, naming the object, instead of hanging
it: the SDKs' defaults (botocore: 60 s reads and up to 10 attempts; azure-storage-blob: 10
retries; google-cloud-storage: 120 s of retries after 60 s reads) add up to many minutes.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from keygroups.errors import StorageError


class DeadlineExceeded(StorageError):
    """A request whose next attempt could not finish before its deadline
    (``KEYFILL_STORAGE_DEADLINE``), raised by every store's retry hook instead of that attempt."""

    @staticmethod
    def message(elapsed_s: float, attempts: int, where: str, last: str) -> str:
        return f"gave up after {elapsed_s:.0f} s and {attempts} attempt(s) on {where}: {last}"


@dataclass(frozen=True)
class StoreLimits:
    """Timeouts for S3, GCS and Azure alike, from ``KEYFILL_STORAGE_CONNECT_TIMEOUT``,
    ``KEYFILL_STORAGE_READ_TIMEOUT`` and ``KEYFILL_STORAGE_DEADLINE`` (seconds). The older
    ``KEYFILL_S3_*`` names are read too when the new ones are unset.

    The read timeout bounds each wait for bytes, not a whole transfer, so large GETs are
    not cut short; the deadline bounds one request across its retries.
    """

    connect_s: float = 5.0
    read_s: float = 20.0
    deadline_s: float = 60.0  # no retry starts that could not finish within this (+1 s per MiB sent)

    ENV = {
        "connect_s": ("KEYFILL_STORAGE_CONNECT_TIMEOUT", "KEYFILL_S3_CONNECT_TIMEOUT"),
        "read_s": ("KEYFILL_STORAGE_READ_TIMEOUT", "KEYFILL_S3_READ_TIMEOUT"),
        "deadline_s": ("KEYFILL_STORAGE_DEADLINE", "KEYFILL_S3_DEADLINE"),
    }

    @classmethod
    def from_env(cls) -> StoreLimits:
        values: dict[str, float] = {}
        named: dict[str, str] = {}
        for name, variables in cls.ENV.items():
            var = next((v for v in variables if os.environ.get(v, "").strip()), None)
            if var is None:
                continue
            raw = os.environ[var]
            named[name] = var
            try:
                values[name] = float(raw)
            except ValueError:
                raise StorageError(f"{var}={raw!r}: expected a number of seconds") from None
            if not 0 < values[name] < 86_400:
                raise StorageError(f"{var}={raw!r}: must be more than 0 seconds and less than a day")
        limits = cls(**values)
        if limits.deadline_s <= limits.read_s:
            deadline = named.get("deadline_s", cls.ENV["deadline_s"][0])
            read = named.get("read_s", cls.ENV["read_s"][0])
            raise StorageError(
                f"{deadline}={limits.deadline_s:g} must exceed {read}={limits.read_s:g}: "
                "otherwise no request could ever be retried"
            )
        return limits

    def allows_retry(self, started_s: float, now_s: float, sent_bytes: int = 0) -> bool:
        """Whether another attempt begun now could still finish before the deadline: a
        request with a body may spend its time sending, so it gets one more second per MiB."""
        return self._room(started_s, now_s, sent_bytes) >= 0

    def retry_wait(self, started_s: float, now_s: float, backoff_s: float, sent_bytes: int = 0) -> float | None:
        """The wait before the next attempt: the SDK's backoff, cut short so that attempt
        can still finish before the deadline; None when no attempt begun now could. S3's
        and Azure's retry loops ask this before they sleep (and let the attempt a cut wait
        was for go), so a request ends at its deadline, not a backoff past it (botocore's
        last backoff reached 4 s over a 2 s deadline); GCS's client bounds its own retries
        by the deadline."""
        room = self._room(started_s, now_s, sent_bytes)
        return None if room < 0 else min(max(backoff_s, 0.0), room)

    # One request's attempts as S3's and Azure's retry loops see them, kept in the SDK's own
    # per-request context (a dict): when it started, the body it sends, and the attempt a cut
    # wait was for.
    def may_send(self, ctx: MutableMapping[str, Any], attempt: int, now_s: float, sent_bytes: int) -> bool:
        """Whether attempt `attempt` (from 1) may start now: the first, the one a cut wait
        was for (`wait_before`; the clock has passed where a new one may start, by design),
        or any other that could still finish by the deadline."""
        started = ctx.setdefault("keyfill_started", now_s)
        ctx["keyfill_sent"] = sent_bytes
        admitted = ctx.pop("keyfill_admitted", None) == attempt
        return attempt == 1 or admitted or self.allows_retry(started, now_s, sent_bytes)

    def wait_before(self, ctx: MutableMapping[str, Any], attempt: int, now_s: float, backoff_s: float) -> float | None:
        """`retry_wait` for attempt `attempt` of the request `ctx` tracks, which `may_send`
        then lets through; None: the request ends now."""
        wait = self.retry_wait(ctx["keyfill_started"], now_s, backoff_s, ctx.get("keyfill_sent", 0))
        if wait is not None:
            ctx["keyfill_admitted"] = attempt
        return wait

    def _room(self, started_s: float, now_s: float, sent_bytes: int) -> float:
        """How long an attempt may wait before it starts and still finish by the deadline."""
        return self.deadline_s + sent_bytes / (1 << 20) - self.read_s - (now_s - started_s)


# Each store's client is rebuilt in every process that unpickles a store (a Spark worker):
# the settings below key a per-process cache, so a worker reuses one client for all tasks.
def environment(prefixes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The variables under these prefixes, as a hashable snapshot for a client cache key."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))
