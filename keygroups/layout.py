"""Where the compacted archive's files live: the folder and file names every writer and
reader agree on, and the recognisers vacuum uses. No imports beyond the standard library,
so the command line can name defaults without loading pyarrow.

Every file a compaction writes carries its *run* id (16 hex digits): a run is one
compaction or append, and its files never overwrite another run's."""

from __future__ import annotations

import re
import uuid

FORMAT = "keyfill.compacted"
FORMAT_VERSION = 3
VERSIONS = "_versions"
RUNS = "_runs"  # a running compaction's lease (compactor.lease): vacuum leaves its files alone
LEGACY_MANIFEST = "_manifest.json"  # format versions 1 and 2: one unversioned manifest
ASSIGNMENTS = "assignments"
INDEX = "index"
INDEX_KINDS = ("slices", "pieces")  # an index file's kind: per slice rows, per piece rows (keygroups.piece_index)
GROUPS = "groups"
# The largest ranged GET readers make by default: AWS's guidance for S3 throughput is 8-16 MB
# per request; shuffle through object storage pays off from 8 MiB (BlobShuffle). 16 MiB keeps
# a replay under 128 GETs per GB once the index's own reads are counted.
GET_BYTES = 16 << 20
# A streaming micro-batch without a limit set: whole slices up to this many compacted bytes
# (at least one slice), as Spark's Kafka source sizes batches by maxOffsetsPerTrigger. Without
# a default a long archive is one micro-batch holding every window at once; with a fixed slice
# count, a three-month archive of short slices was 33,000 micro-batches.
TRIGGER_BYTES = 512 << 20


def replay_gets(file_sizes: list[int], range_bytes: int = GET_BYTES) -> int:
    """GETs a replay makes to read files of these sizes once, each as consecutive ranges of
    at most `range_bytes` (its read-ahead budget permitting)."""
    return sum(-(-size // range_bytes) for size in file_sizes)


_RUN = "[0-9a-f]{16}"
_INDEX_KIND = "(?:" + "|".join(INDEX_KINDS) + ")"
# Every object this layout writes, and nothing else: what vacuum may delete.
_ARCHIVE_KEY = re.compile(
    rf"{VERSIONS}/[0-9]{{20}}\.json|{ASSIGNMENTS}/{_RUN}\.parquet|{RUNS}/{_RUN}(?:\.error)?\.json"
    rf"|{RUNS}/{_RUN}\.task-[0-9a-f]{{16}}\.pickle"
    rf"|{INDEX}/[0-9]{{10}}-{_RUN}\.{_INDEX_KIND}\.parquet|{GROUPS}/[0-9]{{5,}}/[0-9]{{10}}-{_RUN}\.avro"
)
# The run id in the name of a run's file (assignment, index, segment, lease), and a segment's group.
_RUN_OF_KEY = re.compile(
    rf"(?:{ASSIGNMENTS}/|{RUNS}/|{INDEX}/[0-9]{{10}}-|{GROUPS}/(?P<group>[0-9]{{5,}})/[0-9]{{10}}-)"
    rf"(?P<run>{_RUN})\.(?:parquet|json|error\.json|task-[0-9a-f]{{16}}\.pickle|{_INDEX_KIND}\.parquet|avro)"
)


def is_archive_key(key: str) -> bool:
    """Whether `key` (relative to the archive root) is one of the archive's own objects."""
    return _ARCHIVE_KEY.fullmatch(key) is not None


def run_of(key: str) -> tuple[str, int | None] | None:
    """(run, group) of a file a run writes: its run id, and its group for a segment file
    (None for the others); None for version objects and names that are not the layout's."""
    m = _RUN_OF_KEY.fullmatch(key) if is_archive_key(key) else None
    if m is None:
        return None
    return m["run"], None if m["group"] is None else int(m["group"])


def lease_key(run: str) -> str:
    return f"{RUNS}/{run}.json"


def run_error_key(run: str) -> str:
    """Where a Spark task of the run reports a deterministic input error (compactor.task_errors)."""
    return f"{RUNS}/{run}.error.json"


def run_task_key(run: str, digest: str) -> str:
    """A Spark task's function that the run's plan could not carry (compactor.execution):
    a Spark Connect request has a size limit, the store has none."""
    return f"{RUNS}/{run}.task-{digest}.pickle"


def run_of_lease(key: str) -> str | None:
    found = run_of(key)
    return found[0] if found and key == lease_key(found[0]) else None


def new_run() -> str:
    """A compaction run's id: 16 hex digits, random, in every file name the run writes."""
    return uuid.uuid4().hex[:16]


def segment_key(group: int, first_slice: int, run: str) -> str:
    """A segment file, named by its group, first slice and run: listings sort by group,
    then slice."""
    return f"{GROUPS}/{group:05d}/{first_slice:010d}-{run}.avro"


def segment_first_slice(key: str) -> int:
    """The first slice of a segment file, from its name (`segment_key`)."""
    return int(key.rpartition("/")[2][:10])


def index_key(kind: str, first_slice: int, run: str) -> str:
    """An index file of `kind` (one of INDEX_KINDS) covering the slices from `first_slice`,
    named by the run that wrote it: listings sort by slice."""
    return f"{INDEX}/{first_slice:010d}-{run}.{kind}.parquet"


def assignment_key(run: str) -> str:
    return f"{ASSIGNMENTS}/{run}.parquet"


def version_key(version: int) -> str:
    """Zero-padded: listings sort versions in order."""
    return f"{VERSIONS}/{version:020d}.json"
