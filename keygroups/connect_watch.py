"""A Spark Connect endpoint that stops answering, noticed within a bound.

pyspark's Connect client retries a call whose server is gone for about ten minutes (its
`DefaultPolicy`: 15 retries, waits growing to 60 s) before any error surfaces, and a call to
a server that is frozen (SIGSTOP, a driver stalled in garbage collection, a cut that drops
packets) waits with no bound at all: gRPC still sees an open connection (its keepalive needs
the server's leave to ping often: grpc-java servers refuse pings more often than every five
minutes unless told otherwise). So while keyfill runs on a
Connect session it opened (`keyfill ... --remote`, the job scripts under SPARK_REMOTE), a
thread asks the server a small question (its Spark version) every `PROBE_S`, each time on
a channel of its own and with a deadline. When no answer has come for
`KEYFILL_CONNECT_TIMEOUT` seconds (45 by default), it closes the session's channel, which
ends the call in progress at once, and the command ends with `EndpointLost`, one line
naming the endpoint. Any answer counts, an error status too: only silence is a lost endpoint.

The session's retries are kept (a server that restarts in a few seconds is retried), with
waits of at most `PROBE_S`, so a retry in progress notices the closed channel soon after.
From the server's death to the error: the timeout, a probe, one wait, and the client's close
(which waits up to 10 s for calls it was releasing): about a minute at the defaults. Before
a session is made the server is asked the same question (`await_answer`), and the session's
creation is bounded alike (`create_watched`). A session the user made (a notebook's) is theirs,
and is never watched.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from keygroups.errors import KeyfillError, OptionError
from keygroups.spark_kind import is_connect

ENV = "KEYFILL_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT_S = 45.0
PROBE_S = 5.0  # between probes, the deadline of each, and the longest wait between retries
_log = logging.getLogger("keyfill")
T = TypeVar("T")


class EndpointLost(KeyfillError, ConnectionError):
    """The Spark Connect server did not answer for `KEYFILL_CONNECT_TIMEOUT` seconds."""


def timeout_s() -> float:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"{ENV}={raw!r}: expected a number of seconds") from None
    if not 0 < value < 86_400:
        raise OptionError(f"{ENV}={raw!r}: must be more than 0 seconds and less than a day")
    return value


class EndpointWatch:
    """The probing thread of one endpoint: `on_lost` runs once, when no answer came for
    `timeout` seconds."""

    def __init__(self, url: str, timeout: float, on_lost: Callable[[], object]) -> None:
        self.url, self.timeout, self.on_lost = url, timeout, on_lost
        self.lost: EndpointLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="keyfill-connect-watch", daemon=True)

    def start(self) -> EndpointWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(PROBE_S * 2)

    def _watch(self) -> None:
        answered = time.monotonic()
        last = "no answer"
        while not self._stop.wait(PROBE_S):
            try:
                found = probe(self.url)
            except Exception as exc:  # noqa: BLE001 - a probe that fails says nothing answered
                found = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if self._stop.is_set():
                return  # the work ended while the probe waited: nothing to stop
            if found is None:
                answered = now
            else:
                last = found
            if now - answered > self.timeout:
                self.lost = EndpointLost(
                    f"the Spark Connect server at {self.url} did not answer for {now - answered:.0f} s ({last}); "
                    f"the run was stopped (wait longer with {ENV}=<seconds>; run it again once the server is back)"
                )
                try:
                    self.on_lost()
                except Exception:  # noqa: BLE001 - what cannot be ended has nothing left to end
                    pass
                return


# A session id that is not a UUID: Spark's server answers it with INVALID_HANDLE.FORMAT, an
# answer that creates no session there and touches none of the user's.
PROBE_SESSION = "keyfill-probe"


def probe(url: str) -> str | None:
    """None when the server at `url` answered within `PROBE_S`, even with an error; else
    what the probe met. A channel of its own each time: one in reconnection backoff would
    say nothing of the server now."""
    import grpc
    from pyspark.sql.connect import proto
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.proto import base_pb2_grpc

    builder = DefaultChannelBuilder(url)
    request = proto.AnalyzePlanRequest(session_id=PROBE_SESSION)
    request.user_context.user_id = builder.userId or ""
    request.spark_version.SetInParent()
    channel = builder.toChannel()
    try:
        stub = base_pb2_grpc.SparkConnectServiceStub(channel)  # type: ignore[no-untyped-call]  # generated code
        stub.AnalyzePlan(request, metadata=list(builder.metadata()), timeout=PROBE_S)
        return None
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return f"gRPC {code.name}"
        return None  # the server answered, if only with an error
    finally:
        channel.close()


_fired: list[EndpointLost] = []  # watches of this process that found their endpoint gone


def lost() -> EndpointLost | None:
    """Why a keyfill command's session was stopped, if its watch stopped it: the one line a
    caller prints instead of the error the closed channel raised."""
    return _fired.pop() if _fired else None


def _is_remote(url: str | None) -> bool:
    return url is not None and url.startswith("sc://")  # `local[...]`: a server in this process dies with it


def create_watched(make: Callable[[], T], url: str | None, given: str = "--remote ") -> T:
    """`make()` (a Connect session's creation, whose first calls the client retries for ten
    minutes), once the server at `url` answers (`await_answer`; `given`: how the URL was given,
    for its error), or EndpointLost once it has not answered for the timeout."""
    if url is None or not _is_remote(url):
        return make()
    await_answer(url, given)
    done = threading.Event()
    watch = EndpointWatch(url, timeout_s(), done.set).start()
    result: list[T] = []
    failure: list[BaseException] = []

    def make_it() -> None:
        try:
            result.append(make())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=make_it, name="keyfill-connect-session", daemon=True).start()
    done.wait()
    watch.stop()
    if failure:
        raise failure[0]
    if result:
        session = result[0]
        # made in another thread: make it this thread's active session too, as getOrCreate would
        settle = getattr(type(session), "_set_default_and_active_session", None)
        if callable(settle):
            settle(session)
        return session
    _close_clients_of(url)
    assert watch.lost is not None
    raise watch.lost


def await_answer(url: str, given: str = "--remote ") -> None:
    """Return once the server at `url` answers a probe; EndpointLost when it has not for the
    timeout (a server that accepts connections and says nothing: frozen, or a proxy in front
    of nothing). Asked before a session is made: a client made and left waiting keeps the
    process from exiting (pyspark's exit handler calls the server again)."""
    limit = timeout_s()
    started = time.monotonic()
    while (found := probe(url)) is not None:
        waited = time.monotonic() - started
        if waited > limit:
            raise EndpointLost(
                f"{given}{url}: the Spark Connect server accepts connections but did not answer for {waited:.0f} s "
                f"({found}; wait longer with {ENV}=<seconds>)"
            )
        time.sleep(min(PROBE_S, max(limit - waited, 0.0)))


def _close_clients_of(url: str) -> None:
    """Close the Connect clients of this process still unclosed on `url`'s host: one whose
    session never came is reachable only this way, and pyspark's exit handler would call
    its server again, for ten minutes, before the process could exit."""
    import gc

    from pyspark.sql.connect.client import DefaultChannelBuilder, SparkConnectClient

    host = DefaultChannelBuilder(url).host
    for found in gc.get_objects():
        if isinstance(found, SparkConnectClient) and not found.is_closed and found.host == host:
            try:
                found.close()
            except Exception:  # noqa: BLE001 - what cannot close has nothing left to call
                pass


@contextmanager
def watching(spark: Any, url: str | None) -> Iterator[EndpointWatch | None]:
    """`spark` watched while the block runs, when it is a Connect session on an `sc://` URL;
    a lost endpoint closes its channel, which ends the call that waits."""
    if not _is_remote(url) or not is_connect(spark):
        yield None
        return
    assert url is not None
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark.client.set_retry_policies([DefaultPolicy(max_backoff=int(PROBE_S * 1000))])
    watch = EndpointWatch(url, timeout_s(), spark.client.close).start()
    try:
        yield watch
    except BaseException:
        watch.stop()
        if watch.lost is not None:
            _fired.append(watch.lost)  # the error the closed channel raised: `lost()` tells why
        raise
    watch.stop()
