"""One boto3 client per store, built in the process that uses it, with every wait bounded:
connect and read timeouts, retries in the standard mode, and a deadline over all attempts
of one request (`StoreLimits`, from the environment)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

from keygroups.storage.clients import LazyClient
from keygroups.storage.limits import DeadlineExceeded, StoreLimits

S3Limits = StoreLimits  # the name this had when only S3 was bounded

DEFAULT_MAX_ATTEMPTS = 5


def _deadline_hooks(events: Any, limits: StoreLimits) -> None:
    """Give every S3 request a total deadline across botocore's retries.

    botocore bounds each attempt (timeouts) and the number of attempts, but not their sum;
    a hook before each send refuses a retry that could not finish in time, naming the last
    error, and the request fails with that instead of waiting out every attempt.
    """
    from botocore.exceptions import BotoCoreError

    # keyfill's one DeadlineExceeded, and a BotoCoreError too, as botocore expects of what its
    # hooks raise (its transfers and the store's error mapping handle only its own errors)
    class BotocoreDeadline(BotoCoreError, DeadlineExceeded):  # type: ignore[misc]  # botocore has no types: Any
        fmt = "{text}"

        def __init__(self, text: str) -> None:
            BotoCoreError.__init__(self, text=text)

    def before_send(request: Any, **_: Any) -> None:
        ctx = request.context
        now = time.monotonic()
        started = ctx.setdefault("keyfill_started", now)
        attempt = ctx.get("retries", {}).get("attempt", 1)
        sent = int(request.headers.get("Content-Length") or 0)
        if attempt > 1 and not limits.allows_retry(started, now, sent):
            endpoint = urlparse(request.url)
            last = ctx.get("keyfill_last_error", "no answer")
            where = f"endpoint {endpoint.scheme}://{endpoint.netloc}"
            raise BotocoreDeadline(DeadlineExceeded.message(now - started, attempt - 1, where, last))

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


class S3Client(LazyClient):
    """One boto3 client, created on first use and shared by a store and its sub() stores
    (and, in a Spark worker, by every copy with the same settings: `LazyClient`)."""

    ENV_PREFIXES = ("AWS_",)

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
            max_pool_connections=self.pool_size(),
        )
        client = boto3.session.Session(botocore_session=core).client("s3", config=config)
        _deadline_hooks(client.meta.events, self.limits)
        return client
