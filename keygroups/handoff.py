"""Where a live consumer picks up after a backfill: the manifest's hand-off offsets (per
partition, the next offset after the archive) in the forms the Kafka tools take.

- Spark's Kafka source `startingOffsets`: `{"topic": {"0": 1234, ...}}`
- `kafka-consumer-groups --reset-offsets --from-file F --execute`: CSV lines
  `topic,partition,offset` (no header)
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from keygroups.errors import OptionError
from keygroups.manifest import Manifest

FORMATS = ("spark", "csv", "json")


def offsets(manifest: Manifest) -> dict[int, int]:
    """Partition -> next offset after the archive, by partition."""
    return dict(sorted(manifest.handoff.items()))


def spark_starting_offsets(manifest: Manifest) -> str:
    """The `startingOffsets` option of `spark.readStream.format("kafka")`."""
    return json.dumps({manifest.topic: {str(p): o for p, o in offsets(manifest).items()}})


def consumer_groups_csv(manifest: Manifest) -> str:
    """The file `kafka-consumer-groups --reset-offsets --from-file` reads."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for p, o in offsets(manifest).items():
        writer.writerow([manifest.topic, p, o])
    return out.getvalue()


def summary(manifest: Manifest, archive: str) -> dict[str, Any]:
    """Everything about the hand-off, for scripts: offsets and the event time the archive ends at."""
    return {
        "archive": archive,
        "topic": manifest.topic,
        "offsets": {str(p): o for p, o in offsets(manifest).items()},
        "records": manifest.totals.records,
        "slices": manifest.slices,
        "end_ms": manifest.totals.end_ms,
        "spark_starting_offsets": spark_starting_offsets(manifest),
    }


def render(manifest: Manifest, archive: str, fmt: str) -> str:
    if fmt == "spark":
        return spark_starting_offsets(manifest) + "\n"
    if fmt == "csv":
        return consumer_groups_csv(manifest)
    if fmt == "json":
        return json.dumps(summary(manifest, archive), indent=2) + "\n"
    raise OptionError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
