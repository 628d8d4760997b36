"""The options of `format("keyfill")`, parsed once from Spark's string map.

One vocabulary (docs/options.md): an option of the source is the camelCase of the field it
sets here, and a setting the replay shares has the same field name in `reader.options`
(`batch_size` is `batchSize` here, `batch_size=` in `reader.replay` and `--batch-size` in
`keyfill replay`). The live phase's options keep the names Spark's Kafka source gives them,
so a Kafka query's option map carries over (docs/kafka-live.md). Names are case-insensitive.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from keygroups import compacted
from keygroups.bounds import within
from keygroups.durations import parse_duration
from keygroups.errors import OptionError
from reader.errors import DataSourceOptionError
from reader.kafka_live import KAFKA_PREFIX, KafkaOptions
from reader.options import MAX_COUNT, ReplayOptions, bounded, limits_of
from reader.spark.rows import projection


def camel(field: str) -> str:
    """A field's option name: `max_slices_per_trigger` -> `maxSlicesPerTrigger`."""
    head, *rest = field.split("_")
    return head + "".join(word.capitalize() for word in rest)


# The live phase's (with any kafka.* option; docs/kafka-live.md), named as Spark's Kafka source names them.
KAFKA_OPTION_NAMES = (
    "subscribe",
    "minPartitions",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
)
NOT_AN_OPTION = {"option": False}  # a field of Options that no option sets
DEFAULT_MAX_BYTES_PER_TRIGGER = compacted.TRIGGER_BYTES  # when neither limit is set
# A task's read-ahead: its groups' spans in flight. Several tasks share an executor's memory,
# so far below the replay's budget; each group still gets two spans of up to GET_BYTES while
# the task has at most 4 groups.
TASK_READ_AHEAD_BYTES = 8 * compacted.GET_BYTES


@dataclass(frozen=True)
class Options:
    """The source's options, parsed from Spark's string map."""

    path: str
    max_slices_per_trigger: int | None = bounded(None, 1, MAX_COUNT)
    max_bytes_per_trigger: int | None = bounded(None, 1, MAX_COUNT)
    # records a batch, archive (whole slices) and topic alike
    max_offsets_per_trigger: int | None = bounded(None, 1, MAX_COUNT)
    # event-time pacing (reader.strides): each micro-batch reads the slices of one stride of this many ms
    max_event_time_per_trigger: int | None = None
    num_partitions: int | None = bounded(None, 1, MAX_COUNT)
    # rows per Arrow batch handed to Spark
    batch_size: int = bounded(ReplayOptions.batch_size, *limits_of(ReplayOptions, "batch_size"))
    starting_slice: int = bounded(0, 0, MAX_COUNT)
    # a task's fetched, not yet decoded bytes (bounded by the executor's memory over its cores)
    read_ahead_bytes: int = bounded(TASK_READ_AHEAD_BYTES, *limits_of(ReplayOptions, "read_ahead_bytes"))
    # the largest GET; 0: a span in one GET
    range_bytes: int = bounded(ReplayOptions.range_bytes, *limits_of(ReplayOptions, "range_bytes"))
    include_headers: bool = False  # the `headers` column, as in Spark's Kafka source
    # time bounds, as Spark's Kafka source means them (reader.time_bounds): ms since the epoch
    starting_timestamp: int | None = bounded(None, *limits_of(ReplayOptions, "starting_timestamp"))
    ending_timestamp: int | None = bounded(None, *limits_of(ReplayOptions, "ending_timestamp"))
    # {"topic": {"partition": ms, ...}}: a time per partition, every partition named
    starting_offsets_by_timestamp: dict[str, dict[int, int]] | None = None
    ending_offsets_by_timestamp: dict[str, dict[int, int]] | None = None
    starting_offsets: str = "earliest"  # Spark's Kafka source's; the archive starts at its earliest
    ending_offsets: str = "latest"
    kafka: KafkaOptions | None = field(default=None, metadata=NOT_AN_OPTION)  # None: the archive alone
    # Spark's default parallelism when `reader.spark.register` ran (its cores): what sizes
    # numPartitions when it is not set. None: one input partition per group.
    session_cores: int | None = field(default=None, metadata=NOT_AN_OPTION)
    # the columns of a schema the query gave (`.schema(...)`, `reader.spark.rows.projection`),
    # in its order; None: the source's own, all of them
    columns: tuple[str, ...] | None = field(default=None, metadata=NOT_AN_OPTION)

    def with_schema(self, given: Sequence[tuple[str, str, bool]]) -> Options:
        """These options for a query's schema: only its columns are built, and `headers` is
        decoded when the schema has it, whatever includeHeaders says."""
        columns = projection(given, self.include_headers)
        if columns is None:
            return self
        return replace(self, columns=columns, include_headers="headers" in columns)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, session_cores: int | None = None) -> Options:
        opts = {k.lower(): v for k, v in options.items()}
        known = {name.lower() for name in OPTION_NAMES + KAFKA_OPTION_NAMES}
        unknown = sorted(k for k in options if k.lower() not in known and not k.lower().startswith(KAFKA_PREFIX))
        if unknown:  # a misspelt limit would otherwise be ignored without a word
            names = {n.lower(): n for n in OPTION_NAMES + KAFKA_OPTION_NAMES}
            near = [(k, difflib.get_close_matches(k.lower(), list(names), n=1, cutoff=0.75)) for k in unknown]
            meant = [f"{k}: did you mean {names[m[0]]}?" for k, m in near if m]
            raise DataSourceOptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
                + (f" ({'; '.join(meant)})" if meant else "")
                + f"; the keyfill source knows {', '.join(sorted(OPTION_NAMES + KAFKA_OPTION_NAMES))} and kafka.* "
                "(names are case-insensitive)"
            )
        path = opts.get("path")
        if not path:
            raise DataSourceOptionError('the keyfill source needs the archive URL: .load("s3://bucket/compacted")')

        def number(name: str, low: int, high: int, why: str = "", *, size: bool = False) -> int | None:
            raw = opts.get(name.lower())
            if raw is None:
                return None
            try:
                value = byte_size(raw) if size else int(raw)
            except ValueError:
                expected = f"a number of bytes like {SIZE_EXAMPLES}" if size else "a whole number"
                raise DataSourceOptionError(f"option {name}={raw!r}: expected {expected}") from None
            try:
                return within(f"option {name}", value, low, high, why, written=raw)
            except OptionError as e:
                raise DataSourceOptionError(str(e)) from None

        def flag(name: str, default: bool) -> bool:
            raw = opts.get(name.lower(), str(default)).lower()
            if raw not in ("true", "false"):
                raise DataSourceOptionError(f"option {name}={raw!r}: expected true or false")
            return raw == "true"

        client = {k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(KAFKA_PREFIX)}
        live = [name for name in KAFKA_OPTION_NAMES if name.lower() in opts]
        if live and not client:
            raise DataSourceOptionError(
                f"option {live[0]} is for the live phase, which needs kafka.bootstrap.servers (docs/kafka-live.md)"
            )
        kafka = None
        if client:
            if "bootstrap.servers" not in client:
                raise DataSourceOptionError("the live phase needs kafka.bootstrap.servers (host:port,...)")
            kafka = KafkaOptions(
                client=client,
                topic=opts.get("subscribe") or None,
                min_partitions=number("minPartitions", 1, MAX_COUNT),
                fail_on_data_loss=flag("failOnDataLoss", True),
                poll_timeout_ms=number("kafkaConsumer.pollTimeoutMs", 1, MAX_COUNT) or KafkaOptions.poll_timeout_ms,
            )
        given: dict[str, Any] = {  # every whole-number option, within the limits its field declares
            f.name: number(camel(f.name), *f.metadata["bounds"], size="bytes" in f.name.split("_"))
            for f in fields(cls)
            if "bounds" in f.metadata
        }
        given["include_headers"] = flag("includeHeaders", False)
        raw = opts.get("maxeventtimepertrigger")
        if raw is not None:
            try:
                given["max_event_time_per_trigger"] = parse_duration(raw, option="option maxEventTimePerTrigger")
            except OptionError as e:
                raise DataSourceOptionError(str(e)) from None
        for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
            raw = opts.get(name.lower())
            if raw is not None:
                given[_field_of(name)] = by_partition(name, raw)
        for name, only in (("startingOffsets", "earliest"), ("endingOffsets", "latest")):
            raw = opts.get(name.lower())
            if raw is not None and raw.strip().lower() != only:
                raise DataSourceOptionError(
                    f"option {name}={raw!r}: the keyfill source takes {only!r} only (offsets are the archive's own); "
                    f"bound the read in time with {name[: -len('Offsets')]}Timestamp or {name}ByTimestamp"
                )
        if given.get("starting_slice") and any(
            given.get(f) is not None for f in ("starting_timestamp", "starting_offsets_by_timestamp")
        ):
            raise DataSourceOptionError(
                "options startingSlice and startingTimestamp/startingOffsetsByTimestamp: set one"
            )
        if given.get("max_event_time_per_trigger") is not None:
            _check_paced(given)
        given = {k: v for k, v in given.items() if v is not None}
        return cls(path=path, kafka=kafka, session_cores=session_cores, **given)


PACED_WITHOUT_START = (
    "option maxEventTimePerTrigger needs startingTimestamp (or startingOffsetsByTimestamp): the event time the "
    "first micro-batch starts at, given alike to every paced source of the query so they read the same stride in "
    "the same micro-batch"
)


def _check_paced(given: dict[str, Any]) -> None:
    """Pacing needs a start every paced source of the query shares, and takes no other
    admission limit: a source cannot see where the others' limits would cut a stride
    (docs/spark-source.md, "Joining topics")."""
    if given.get("starting_timestamp") is None and given.get("starting_offsets_by_timestamp") is None:
        raise DataSourceOptionError(PACED_WITHOUT_START)
    for limit in ("maxSlicesPerTrigger", "maxBytesPerTrigger"):
        if given.get(_field_of(limit)) is not None:
            raise DataSourceOptionError(
                f"options maxEventTimePerTrigger and {limit}: set one (a paced micro-batch is one stride of event "
                f"time in every source; {limit} would cut a stride where the other sources do not)"
            )


# Spark's units for a size (spark.executor.memory=4g, Delta's maxBytesPerTrigger=1g): powers
# of 1024 whether written k or kb; the IEC names too. Written here: the JVM's parser
# (JavaUtils.byteStringAsBytes) is out of reach of the Python process that plans a query.
_SIZE_UNITS = {"": 0, "b": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50}
_SIZE_UNITS |= {u + "b": bits for u, bits in _SIZE_UNITS.items() if u not in ("", "b")}
_SIZE_UNITS |= {u[0] + "ib": bits for u, bits in _SIZE_UNITS.items() if len(u) == 2}
SIZE_EXAMPLES = "536870912, 512m or 1g (Spark's units: k, m, g, t are powers of 1024)"


def byte_size(raw: str) -> int:
    """A number of bytes as Spark writes sizes: 536870912, 512m, 512mb, 512MiB, 1g."""
    text = raw.strip().lower().replace(" ", "")
    digits = len(text) - len(text.lstrip("0123456789"))
    if not digits or text[digits:] not in _SIZE_UNITS:
        return int(text)  # a sign, or nothing that reads as a size: int() says which (ValueError)
    return int(text[:digits]) << _SIZE_UNITS[text[digits:]]


def _field_of(option: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in option)


def by_partition(name: str, raw: str) -> dict[str, dict[int, int]]:
    """`{"topic": {"0": 1700000000000, ...}}`, checked: one topic, whole numbers."""
    try:
        value = json.loads(raw)
        parsed = {str(t): {int(p): int(ms) for p, ms in parts.items()} for t, parts in value.items()}
    except (ValueError, TypeError, AttributeError):
        raise DataSourceOptionError(
            f'option {name}={raw!r}: expected JSON like {{"topic": {{"0": 1700000000000, "1": 1700000000000}}}}'
        ) from None
    if len(parsed) != 1:
        raise DataSourceOptionError(f"option {name}={raw!r}: name the archive's one topic")
    return parsed


# Every field but those marked NOT_AN_OPTION is an option of its camelCase name (the live
# phase is set by KAFKA_OPTION_NAMES and kafka.*).
OPTION_NAMES = tuple(camel(f.name) for f in fields(Options) if f.metadata.get("option", True))
