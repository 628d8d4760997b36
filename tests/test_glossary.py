"""The glossary's promise (docs/design.md, "Words"): a word it reserves means one thing in
every identifier of the product code. A name that carries a reserved word ("run", "source",
"span", "stride", "block", "plan", "parcel", alone or plural, as a part of a snake_case or
CamelCase name) must be listed below under that word, as a use in the glossary's sense. A
new one fails this test until it is listed (it means the glossary's thing) or renamed (it
does not: a verb "run" is a task's or a call's, a Spark "data source" is not a source
archive, an Azure block is an upload part, a stretch of bytes is a range); a listed name no
longer in the code fails it too, so the list stays the code's.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keygroups", "reader", "compactor", "keyfill", "jobs")
RESERVED = ("run", "source", "span", "stride", "block", "plan", "parcel")

# word -> the identifiers that carry it in the glossary's sense
SENSES: dict[str, set[str]] = {
    # one compaction or append: its id, lease, files and error object
    "run": {
        "RUNS",
        "RunInProgress",
        "_RUN",
        "_RUN_OF_KEY",
        "committed_runs",
        "dry_run",  # a compaction planned and not written: `--dry-run`, as every CLI says it
        "index_run",
        "index_runs",
        "keep_runs",
        "new_run",
        "old_runs",
        "run",
        "run_error_key",
        "run_id",
        "run_of",
        "run_of_lease",
        "run_task_key",
        "runs",
    },
    # a source archive (its formats, chunks and options), or a record read from one
    "source": {
        "EnvelopeSource",
        "IcebergSource",
        "DeltaSource",
        "KafkaConnectSource",
        "KafkaSegmentsSource",
        "SOURCE",
        "SOURCE_FORMAT",
        "SourceArchive",
        "SourceChunk",
        "SourceOptions",
        "SourceRef",
        "add_source_options",
        "inspect_source",
        "open_source",
        "source",
        "source_bytes",
        "source_class",
        "source_format",
        "source_from_args",
        "source_options",
        "source_options_from_args",
        # Spark's "data source", said whole: format("keyfill")
        "DataSourceOptionError",
        "DataSourceUnavailable",
        "DATA_SOURCES",
        "KeyfillDataSource",
        "data_source_name",
        "require_data_sources",
    },
    # consecutive pieces of one segment file fetched together
    "span": {
        "FetchedSpan",
        "_next_span",
        "_span_bytes",
        "_spans",
        "read_span",
        "span",
        "span_bytes",
        "spans",
        "split_span",
    },
    # a step of event time a paced micro-batch reads
    "stride": {"Strides", "stride_ms", "strides"},
    # an Avro block of a segment or source file
    "block": {
        "BLOCK_BYTES",
        "Blocks",
        "DEFAULT_BLOCK_BYTES",
        "MAX_BLOCK_BYTES",
        "_WHOLE_BLOCK",
        "_fastavro_blocks",
        "_raw_blocks",
        "_scan_blocks",
        "block",
        "block_bytes",
        "block_end",
        "blocks",
        "blocks_of",
        "decompress_blocks",
        "encode_blocks",
        "frame_blocks",
        "read_block_count",
        "read_blocks",
    },
    # what is decided before the work, nothing written or fetched
    "plan": {
        "AuditPlan",
        "ReplayPlan",
        "SlicePlan",
        "VacuumPlan",
        "_plan",
        "plan",
        "plan_audit",
        "plan_ranges",
        "plan_slices",
        "plan_vacuum",
    },
    # what crosses the rewrite's shuffle
    "parcel": {
        "PARCELS",
        "PARCEL_BATCH_BYTES",
        "PARCEL_BYTES",
        "PARCEL_SCHEMA",
        "_parcel_rows",
        "_parcels",
        "_parcels_task",
        "parcel",
        "parcels",
    },
}


def words(name: str) -> list[str]:
    """The lower-case parts of a snake_case or CamelCase name (`ArchivePlanner` -> archive, planner)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name))
    return [w.lower() for w in spaced.split("_") if w]


def bound_names(tree: ast.AST) -> set[str]:
    """Every name the code gives: classes, functions, arguments, assigned names and attributes."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.alias) and node.asname:
            out.add(node.asname)
    return out


def carriers() -> dict[str, dict[str, set[str]]]:
    """word -> identifier -> the files that bind it."""
    found: dict[str, dict[str, set[str]]] = {w: defaultdict(set) for w in RESERVED}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in bound_names(ast.parse(path.read_text(), str(path))):
                parts = words(name)
                for w in RESERVED:
                    if w in parts or w + "s" in parts:
                        found[w][name].add(str(path.relative_to(ROOT)))
    return found


def test_words_split_as_names_are_read() -> None:
    assert words("run_id") == ["run", "id"]
    assert words("KafkaConnectSource") == ["kafka", "connect", "source"]
    assert words("HTTPSource") == ["http", "source"]
    assert words("_BLOCK_BYTES") == ["block", "bytes"]
    assert "run" not in words("runner") and "plan" not in words("ArchivePlanner")


def test_reserved_words_keep_their_glossary_sense() -> None:
    found = carriers()
    assert found["source"], "no identifier found at all: the scan would pass on nothing"
    unlisted = [
        f"{w}: {name} ({', '.join(sorted(files))})"
        for w in RESERVED
        for name, files in sorted(found[w].items())
        if name not in SENSES[w]
    ]
    assert not unlisted, (
        "identifiers with a word the glossary reserves (docs/design.md, Words): list each in SENSES if it "
        "means the glossary's thing, else rename it:\n" + "\n".join(unlisted)
    )
    stale = [f"{w}: {name}" for w in RESERVED for name in sorted(SENSES[w]) if name not in found[w]]
    assert not stale, "no longer in the code; delete from SENSES:\n" + "\n".join(stale)


# Prose the product ships: the docs, and the docstrings and comments of its code.
PROSE = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
PROSE += [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
# "a run of ...", "runs of ...": a stretch of something, never one compaction or append; the
# one phrase in the glossary's sense that takes "of" is a process's runs.
RUN_OF = re.compile(r"\bruns? of (?!this process\b)[a-z]", re.IGNORECASE)


def test_prose_says_run_only_in_the_glossary_sense() -> None:
    """ "Run" in the docs and in the code's prose is one compaction or append too: a
    stretch of pieces, blocks or batches is named for what it is (a span, a parcel, a step,
    a sequence), a run of a test or a query is a session or a start."""
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}..."
        for path in PROSE
        for text in [path.read_text()]
        for m in RUN_OF.finditer(text)
    ]
    assert len(PROSE) > 100, "the prose was not found: the check would pass on nothing"
    assert not found, "'run' in another sense than the glossary's (docs/design.md, Words):\n" + "\n".join(found)


def test_the_prose_check_finds_a_run_of_pieces() -> None:
    assert RUN_OF.search("ranged GETs fetch runs of pieces") and RUN_OF.search("A run of the rewrite")
    assert not RUN_OF.search("the runs of this process that have ended") and not RUN_OF.search("each run's lease")
