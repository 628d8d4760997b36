"""The options of `format("keyfill")`, parsed once from Spark's string map: one table of
names (case-insensitive), the archive phase's and the live phase's (docs/spark-source.md,
docs/kafka-live.md)."""

from __future__ import annotations

from dataclasses import dataclass

from keygroups import compacted
from keygroups.errors import OptionError
from reader.kafka_live import KAFKA_PREFIX, KafkaOptions


class SourceOptionError(OptionError):
    """An option of the keyfill Spark source is missing or malformed; names the option."""


OPTION_NAMES = ("path", "maxSlicesPerTrigger", "maxBytesPerTrigger", "numPartitions", "batchRows", "startingSlice")
# The live phase's (with any kafka.* option; docs/kafka-live.md), named as Spark's Kafka source names them.
KAFKA_OPTION_NAMES = (
    "subscribe",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
)
_KNOWN = {name.lower() for name in OPTION_NAMES + KAFKA_OPTION_NAMES}
DEFAULT_MAX_BYTES_PER_TRIGGER = compacted.TRIGGER_BYTES  # when neither limit is set


@dataclass(frozen=True)
class Options:
    """The source's options, parsed from Spark's string map (names are case-insensitive)."""

    path: str
    max_slices_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    num_partitions: int | None = None
    batch_rows: int = 65_536
    starting_slice: int = 0
    kafka: KafkaOptions | None = None  # None: the archive alone

    @classmethod
    def parse(cls, options: dict[str, str]) -> Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in options if k.lower() not in _KNOWN and not k.lower().startswith(KAFKA_PREFIX))
        if unknown:  # a misspelt limit would otherwise be ignored without a word
            raise SourceOptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the keyfill source knows "
                f"{', '.join(sorted(OPTION_NAMES + KAFKA_OPTION_NAMES))} and kafka.* (names are case-insensitive)"
            )
        path = opts.get("path")
        if not path:
            raise SourceOptionError('the keyfill source needs the archive URL: .load("s3://bucket/compacted")')

        def positive(name: str) -> int | None:
            raw = opts.get(name.lower())
            if raw is None:
                return None
            try:
                value = int(raw)
            except ValueError:
                raise SourceOptionError(f"option {name}={raw!r}: expected a whole number") from None
            if value < 1:
                raise SourceOptionError(f"option {name}={raw!r}: must be at least 1")
            return value

        start = opts.get("startingslice", "0")
        if not start.isdigit():
            raise SourceOptionError(f"option startingSlice={start!r}: expected a slice number (0 or more)")
        client = {k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(KAFKA_PREFIX)}
        live = [name for name in KAFKA_OPTION_NAMES if name.lower() in opts]
        if live and not client:
            raise SourceOptionError(
                f"option {live[0]} is for the live phase, which needs kafka.bootstrap.servers (docs/kafka-live.md)"
            )
        kafka = None
        if client:
            if "bootstrap.servers" not in client:
                raise SourceOptionError("the live phase needs kafka.bootstrap.servers (host:port,...)")
            fail = opts.get("failondataloss", "true").lower()
            if fail not in ("true", "false"):
                raise SourceOptionError(f"option failOnDataLoss={fail!r}: expected true or false")
            kafka = KafkaOptions(
                client=client,
                topic=opts.get("subscribe") or None,
                max_offsets_per_trigger=positive("maxOffsetsPerTrigger"),
                min_partitions=positive("minPartitions"),
                fail_on_data_loss=fail == "true",
                poll_timeout_ms=positive("kafkaConsumer.pollTimeoutMs") or KafkaOptions.poll_timeout_ms,
            )
        return cls(
            path=path,
            max_slices_per_trigger=positive("maxSlicesPerTrigger"),
            max_bytes_per_trigger=positive("maxBytesPerTrigger"),
            num_partitions=positive("numPartitions"),
            batch_rows=positive("batchRows") or 65_536,
            starting_slice=int(start),
            kafka=kafka,
        )
