"""Every version's archive is the same (tests/spark_versions/run's last step): each
environment of the matrix wrote the canonical digest of the archive it compacted, classic
and over Spark Connect; all must be equal, and every version given must have written one."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str, versions: list[str]) -> int:
    found = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    for f in found:
        print(f"  {f['session']:<8} pyspark {f['pyspark']:<8} {f['digest'][:16]}")
    missing = [v for v in versions if not any(f["pyspark"].startswith(v + ".") for f in found)]
    digests = {f["digest"] for f in found}
    if missing or len(digests) != 1:
        print(f"archives differ across versions, or missing for {missing}: {len(digests)} digest(s)")
        return 1
    print(f"the same archive on {len(found)} runs: {', '.join(sorted({f['pyspark'] for f in found}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
