"""One boto3 client per store, built in the process that uses it, with every wait bounded:
connect and read timeouts, retries in the standard mode, and a deadline over all attempts
of one request (`StoreLimits`, from the environment)."""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlparse

from keygroups.storage.clients import LazyClient
from keygroups.storage.limits import DeadlineExceeded, StoreLimits

S3Limits = StoreLimits  # the name this had when only S3 was bounded

# Unset AWS_MAX_ATTEMPTS: attempts until the deadline ends the request, as GCS's and Azure's
# SDKs retry for a time, not a count. A count of 5 ended a throttled read (503 SlowDown) after
# a few seconds of backoff, with botocore's error instead of the deadline's, whichever came first.
DEFAULT_MAX_ATTEMPTS = 100


def _deadline_hooks(client: Any, limits: StoreLimits, max_attempts: int) -> None:
    """Give every S3 request a total deadline across botocore's retries.

    botocore bounds each attempt (timeouts) and the number of attempts, but not their sum.
    Its retry handler's backoff is cut to what leaves the next attempt time to finish
    (`StoreLimits.retry_wait`), and when none could, the request fails at once with
    DeadlineExceeded naming the last error; a hook before each send refuses a retry the
    clock has overtaken all the same. botocore takes no backoff bound in its Config, and
    its handler's delay is the only way to one, so this module registers botocore's own
    standard handler again (`botocore.retries.standard.register_retry_handler`, the call
    botocore makes) and wraps what it returns.
    """
    from botocore.exceptions import BotoCoreError
    from botocore.retries import standard

    # keyfill's one DeadlineExceeded, and a BotoCoreError too, as botocore expects of what its
    # hooks raise (its transfers and the store's error mapping handle only its own errors)
    class BotocoreDeadline(BotoCoreError, DeadlineExceeded):  # type: ignore[misc]  # botocore has no types: Any
        fmt = "{text}"

        def __init__(self, text: str) -> None:
            BotoCoreError.__init__(self, text=text)

    def refusal(ctx: dict[str, Any], url: str, now: float, attempts: int) -> BotocoreDeadline:
        endpoint = urlparse(url)
        where = f"endpoint {endpoint.scheme}://{endpoint.netloc}"
        last = ctx.get("keyfill_last_error", "no answer")
        return BotocoreDeadline(DeadlineExceeded.message(now - ctx["keyfill_started"], attempts, where, last))

    def before_send(request: Any, **_: Any) -> None:
        ctx = request.context
        now = time.monotonic()
        attempt = ctx.get("retries", {}).get("attempt", 1)
        if not limits.may_send(ctx, attempt, now, int(request.headers.get("Content-Length") or 0)):
            raise refusal(ctx, request.url, now, attempt - 1)

    def last_error(request_dict: Any, response: Any = None, caught_exception: Any = None, **_: Any) -> None:
        if caught_exception is not None:
            request_dict["context"]["keyfill_last_error"] = str(caught_exception)
        elif response is not None:
            err = response[1].get("Error", {}) if isinstance(response[1], dict) else {}
            if err:
                request_dict["context"]["keyfill_last_error"] = f"{err.get('Code')} {err.get('Message', '')}".strip()
        return None  # the decision is the handler's below

    events = client.meta.events
    event, unique = "needs-retry.s3", "retry-config-s3"  # botocore's names for its S3 retry handler
    events.unregister(event, unique_id=unique)
    handler = standard.register_retry_handler(client, max_attempts=max_attempts)
    events.unregister(event, unique_id=unique)

    def needs_retry(attempts: int, request_dict: Any, **kwargs: Any) -> Any:
        delay = handler.needs_retry(attempts=attempts, request_dict=request_dict, **kwargs)
        ctx = request_dict["context"]
        if type(delay) not in (int, float) or "keyfill_started" not in ctx:
            return delay  # None: no retry; False: botocore's "stop, and no other handler"
        now = time.monotonic()
        wait = limits.wait_before(ctx, attempts + 1, now, delay)
        if wait is None:
            raise refusal(ctx, request_dict["url"], now, attempts)
        return wait

    events.register_first(event, last_error)
    events.register(event, needs_retry, unique_id=unique)
    events.register_first("before-send.s3", before_send)


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
        attempts = int(core.get_config_variable("max_attempts") or DEFAULT_MAX_ATTEMPTS)
        config = Config(
            region_name=core.get_config_variable("region") or "us-east-1",
            retries={
                # 'legacy' (botocore's default) gives up after 4 attempts on throttling.
                "mode": mode if mode in ("standard", "adaptive") else "standard",
                "total_max_attempts": attempts,
            },
            connect_timeout=self.limits.connect_s,
            read_timeout=self.limits.read_s,
            max_pool_connections=self.pool_size(),
        )
        client = boto3.session.Session(botocore_session=core).client("s3", config=config)
        _deadline_hooks(client, self.limits, attempts)
        return client


# botocore's credential providers (each Credentials' `method`) in words a user can act on
_ORIGINS = {
    "explicit": "keys passed to the client",
    "env": "AWS_ACCESS_KEY_ID in the environment",
    "shared-credentials-file": "the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials)",
    "config-file": "the AWS config file (AWS_CONFIG_FILE or ~/.aws/config)",
    "custom-process": "the profile's credential_process",
    "assume-role": "a role assumed through the profile's role_arn",
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE, as EKS's IRSA sets)",
    "sso": "IAM Identity Center (aws sso login) of the profile",
    "login": "an aws login session of the profile",
    "container-role": "the container's role (an ECS task role, EKS Pod Identity)",
    "iam-role": "the instance's role (EC2 instance metadata)",
    "ec2-credentials-file": "the EC2 credentials file",
    "boto-config": "a boto config file (BOTO_CONFIG, /etc/boto.cfg)",
}
_PROFILED = {"shared-credentials-file", "config-file", "custom-process", "assume-role", "sso", "login"}


def credential_origin(client: Any) -> str:
    """Where `client`'s credentials came from, for an error that says S3 refused them:
    botocore records the provider that found them (`Credentials.method`)."""
    # BaseClient._get_credentials: botocore's own accessor (private; absent, say less)
    credentials = getattr(client, "_get_credentials", lambda: None)()
    if credentials is None:
        return "botocore's credential chain"
    method = str(getattr(credentials, "method", "") or "")
    origin = _ORIGINS.get(method, f"botocore's {method!r} provider" if method else "botocore's credential chain")
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    return f"{origin}, profile {profile}" if profile and method in _PROFILED else origin
