"""Where each writer of Kafka topics as tables (Iceberg, Delta) keeps a record's Kafka fields:
named presets, a `--columns` mapping, and the check of either against a table's schema.

A layout names a column path (dots step into structs) for each envelope field, or several
paths separated by `|`, the first the table has taken (a writer's naming options). The value is
either a column (binary or text) or, when the writer decoded it into columns, the JSON text of
every top-level column that holds no Kafka field, as the Kafka Connect source writes values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from compactor.errors import ArchiveError
from keygroups.errors import OptionError

FIELDS = ("partition", "offset", "timestamp", "key", "value", "headers", "topic")
NEEDED = ("partition", "offset", "timestamp")


@dataclass(frozen=True)
class ColumnLayout:
    """A column path for each Kafka field a writer keeps (`a|b`: the first the table has);
    None where it keeps none (no key, no headers; no value column: the value is the JSON of
    the other columns)."""

    name: str
    partition: str
    offset: str
    timestamp: str
    key: str | None = None
    value: str | None = None
    headers: str | None = None
    topic: str | None = None
    others: tuple[str, ...] = ()  # top-level columns the writer adds that are not the value
    # Whether a value column that is not bytes or text is a field of the value (the value is
    # then the JSON of all such columns, as in Redpanda's flat layout), not the value decoded.
    flat_value: bool = False

    def paths(self) -> dict[str, str]:
        return {f: p for f in FIELDS if (p := getattr(self, f)) is not None}

    def spec(self) -> str:
        """The layout as `--columns` takes it (what a manifest records)."""
        return ",".join(f"{f}={p}" for f, p in self.paths().items())


# Each writer's layout, as its documentation gives it (docs/delta-source.md and
# docs/iceberg-source.md show a table of each). Auto-detection tries them in this order.
PRESETS: dict[str, ColumnLayout] = {
    p.name: p
    for p in (
        # Spark's Kafka source, as a bronze job writes it (Databricks, any Spark)
        ColumnLayout(
            "kafka",
            "partition",
            "offset",
            "timestamp",
            key="key",
            value="value",
            headers="headers",
            topic="topic",
            others=("timestampType",),
        ),
        # Redpanda Iceberg Topics: a struct beside the value (key_value mode) or its columns
        ColumnLayout(
            "redpanda",
            "redpanda.partition",
            "redpanda.offset",
            "redpanda.timestamp",
            key="redpanda.key",
            value="value",
            headers="redpanda.headers",
            flat_value=True,
        ),
        # Confluent Tableflow: system columns after the value's (and key's) own fields, named
        # $$… by default or cflt_metadata_… (the portable naming); the raw bytes when kept.
        ColumnLayout(
            "tableflow",
            "$$partition|cflt_metadata_partition",
            "$$offset|cflt_metadata_offset",
            "$$timestamp|cflt_metadata_timestamp",
            key="$$raw-key|cflt_metadata_raw_key|key",
            value="$$raw-value|cflt_metadata_raw_value",
            headers="$$headers|cflt_metadata_headers",
            topic="$$topic|cflt_metadata_topic",
            others=(
                "$$leader-epoch",
                "cflt_metadata_leader_epoch",
                "$$timestamp-type",
                "cflt_metadata_timestamp_type",
                "$$raw-key",
                "cflt_metadata_raw_key",
                "key",
            ),
        ),
        # Apache Iceberg's Kafka Connect sink with its KafkaMetadataTransform: a struct (or,
        # not nested, prefixed columns) of topic, partition, offset and epoch milliseconds
        # beside the value's fields; it keeps no key and no headers.
        ColumnLayout(
            "iceberg-kafka-connect",
            "_kafka_metadata.partition|_kafka_metadata_partition",
            "_kafka_metadata.offset|_kafka_metadata_offset",
            "_kafka_metadata.timestamp|_kafka_metadata_timestamp",
            topic="_kafka_metadata.topic|_kafka_metadata_topic",
        ),
        # Aiven's Iceberg topics (its tiered storage): a kafka struct of the record's and its
        # batch's fields, the key and value decoded (and raw when kept), headers
        ColumnLayout(
            "aiven",
            "kafka.partition",
            "kafka.offset",
            "kafka.timestamp",
            key="key_raw|key",
            value="value_raw|value",
            headers="headers",
            others=("key", "value"),
        ),
    )
}


def parse_columns(spec: str) -> tuple[ColumnLayout | None, dict[str, str | None]]:
    """`--columns`: a preset's name, or `field=column` pairs (comma-separated) that may follow
    a preset's name to change some of its columns (`kafka,value=payload`; `key=` drops one):
    the preset, if named, and the pairs."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    base: ColumnLayout | None = None
    if parts and "=" not in parts[0]:
        name = parts.pop(0)
        if name not in PRESETS:
            raise OptionError(f"--columns: no preset {name!r}; the presets are {', '.join(PRESETS)}")
        base = PRESETS[name]
    given: dict[str, str | None] = {}
    for part in parts:
        field, sep, path = (s.strip() for s in part.partition("="))
        if not sep or field not in FIELDS:
            raise OptionError(
                f"--columns: {part!r} is not field=column with a field of {', '.join(FIELDS)} (e.g. offset=meta.offset)"
            )
        given[field] = path or None
    if base is None and (missing := [f for f in NEEDED if not given.get(f)]):
        raise OptionError(f"--columns: {spec!r} names no column for {', '.join(missing)}")
    if base is not None and any(given.get(f, "") is None for f in NEEDED):
        raise OptionError(f"--columns: {spec!r} drops a column of {', '.join(NEEDED)}, which every record needs")
    return base, given


def _layout(name: str, paths: dict[str, str | None], others: tuple[str, ...], flat_value: bool = False) -> ColumnLayout:
    def needed(field: str) -> str:
        path = paths.get(field)
        assert path, field  # parse_columns has checked the needed three are named
        return path

    optional = {f: paths.get(f) for f in FIELDS if f not in NEEDED}
    return ColumnLayout(
        name,
        needed("partition"),
        needed("offset"),
        needed("timestamp"),
        key=optional["key"],
        value=optional["value"],
        headers=optional["headers"],
        topic=optional["topic"],
        others=others,
        flat_value=flat_value,
    )


def find_path(schema: pa.Schema, path: str) -> pa.Field | None:
    """The field a dotted path names, stepping into structs; None if the table lacks it."""
    head, *rest = path.split(".")
    if head not in schema.names:
        return None
    field = schema.field(head)
    for step in rest:
        if not pa.types.is_struct(field.type) or field.type.get_field_index(step) < 0:
            return None
        field = field.type.field(step)
    return field


def pick(schema: pa.Schema, paths: str) -> str | None:
    """Of `a|b|…`, the first path the table has; None if it has none."""
    return next((p for p in paths.split("|") if find_path(schema, p) is not None), None)


def _type(schema: pa.Schema, path: str) -> pa.DataType:
    found = find_path(schema, path)
    assert found is not None, path
    return found.type


def _is_text(t: pa.DataType) -> bool:
    return (
        bool(pa.types.is_binary(t))
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
    )


def _is_headers(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_struct(t.value_type) and t.value_type.get_field_index("key") >= 0
    )


KINDS: dict[str, tuple[Callable[[pa.DataType], bool], str]] = {
    "partition": (pa.types.is_integer, "an integer"),
    "offset": (pa.types.is_integer, "an integer"),
    "timestamp": (lambda t: pa.types.is_timestamp(t) or pa.types.is_integer(t), "a timestamp or epoch milliseconds"),
    "headers": (_is_headers, "list<struct<key, value>> or map<string, binary>"),
    "topic": (_is_text, "text"),
}


def _check(layout: ColumnLayout, schema: pa.Schema, where: str) -> None:
    for field, path in layout.paths().items():
        found = find_path(schema, path)
        if found is None:
            top = ", ".join(schema.names[:12]) + (" …" if len(schema.names) > 12 else "")
            raise ArchiveError(
                f"{where}: {field} is column {path!r} in the {layout.name!r} layout, "
                f"which the table lacks (its columns: {top})"
            )
        ok, wanted = KINDS.get(field, (lambda t: True, ""))
        if not ok(found.type):
            raise ArchiveError(f"{where}: {field} column {path!r} is {found.type}, not {wanted}")


def resolve(spec: str | None, schema: pa.Schema, where: str) -> ColumnLayout:
    """The layout `--columns` names, checked against the table; without a preset named, the
    first whose partition, offset and timestamp columns the table has (or, if none has all
    three, the closest, so the error names what it lacks). A preset's other columns the table
    lacks are none; a column the pairs name must be there."""
    base, given = parse_columns(spec) if spec else (None, {})
    if spec and base is None:
        layout = _layout("columns", {f: p and (pick(schema, p) or p) for f, p in given.items()}, ())
    else:
        layout = _fitted(base or _closest(schema, where), schema)
        if given:
            changed = {f: p and (pick(schema, p) or p) for f, p in given.items()}
            layout = _layout(f"{layout.name}+", {**layout.paths(), **changed}, layout.others, layout.flat_value)
    _check(layout, schema, where)
    if layout.value is None and not value_columns(layout, schema.names):
        raise ArchiveError(f"{where}: the table has no value column beside the {layout.name!r} layout's columns")
    return layout


def _closest(schema: pa.Schema, where: str) -> ColumnLayout:
    found = {name: sum(pick(schema, getattr(p, f)) is not None for f in NEEDED) for name, p in PRESETS.items()}
    best = max(found, key=lambda name: found[name])  # the first of the closest
    if found[best] == 0:
        known = "; ".join(f"{p.name}: {', '.join(getattr(p, f) for f in NEEDED)}" for p in PRESETS.values())
        raise ArchiveError(
            f"{where}: the table has the columns of no writer keyfill knows ({known}); "
            "name them with --columns partition=…,offset=…,timestamp=…"
        )
    return PRESETS[best]


def _fitted(preset: ColumnLayout, schema: pa.Schema) -> ColumnLayout:
    """The preset with each field's first path the table has; its optional fields the table
    lacks as none (a writer's older versions), and in a flat layout a value column that is
    not bytes or text as none too (it is one of the value's own fields)."""
    kept: dict[str, str | None] = {}
    for f, p in preset.paths().items():
        chosen = pick(schema, p)
        field_of_value = f == "value" and preset.flat_value and chosen and not _is_text(_type(schema, chosen))
        if f in NEEDED or (chosen is not None and not field_of_value):
            kept[f] = chosen or p
    return _layout(preset.name, kept, preset.others, preset.flat_value)


def value_columns(layout: ColumnLayout, names: Iterable[str]) -> list[str]:
    """Without a value column: the top-level columns whose JSON is the value (a key column
    stays one of them: a mapping may take the key from a field of the value)."""
    taken = {p.split(".")[0] for f, p in layout.paths().items() if f != "key"} | set(layout.others)
    return [n for n in names if n not in taken]


def top_columns(layout: ColumnLayout, names: Iterable[str]) -> list[str]:
    """The top-level columns a read needs, in the table's order."""
    names = list(names)
    wanted = {p.split(".")[0] for p in layout.paths().values()}
    if layout.value is None:
        wanted |= set(value_columns(layout, names))
    return [n for n in names if n in wanted]


def column(table: pa.Table, path: str) -> pa.Array:
    """The array a dotted path names in a read table (nulls where a parent struct is null)."""
    head, *rest = path.split(".")
    arr = table.column(head).combine_chunks()
    for step in rest:
        arr = pc.struct_field(arr, step)
    return arr


COLUMNS_HELP = (
    "where the table keeps each Kafka field: a writer's preset ("
    + ", ".join(PRESETS)
    + ") or comma-separated field=column pairs (offset=meta.offset), after a preset's name to change"
    " some of its columns; default: the preset whose columns the table has"
)
