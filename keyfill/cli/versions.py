"""`keyfill versions`: the committed versions of a compacted archive, oldest first."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keygroups.storage import Storage


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "versions",
        help="list the committed versions of a compacted archive",
        description="List every committed version of a compacted archive, oldest first: when it was committed, "
        "by which kind of run (compact, append), which archive it belongs to (a full compaction starts a new one; "
        "appends keep it), and its slices and records. Readers open the latest version.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument("--json", action="store_true", help="print the versions as JSON")
    p.set_defaults(handle=handle)


def rows(store: Storage) -> list[dict[str, Any]]:
    from keygroups import compacted

    out = []
    for n in compacted.versions(store):
        m = compacted.load_manifest(store, n)
        out.append(
            {
                "version": m.version,
                "created_ms": m.created_ms,
                "kind": m.kind,
                "parent": m.parent,
                "archive": m.archive,
                "slices": m.slices,
                "records": m.totals.records,
                "end_ms": m.totals.end_ms,
                "run": m.run,
            }
        )
    return out


def handle(args: argparse.Namespace) -> int:
    from keyfill.cli.args import iso
    from keygroups.errors import FormatError
    from keygroups.storage import open_storage

    store = open_storage(args.url)
    found = rows(store)
    if not found:
        from keygroups import compacted

        compacted.load_manifest(store)  # names what is there instead (nothing, or an unversioned archive)
        raise FormatError(f"{store.url}: no committed version")
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    head = f"{'version':>7}  {'committed (UTC)':<24} {'kind':<8} {'archive':<16} {'slices':>8} {'records':>14}"
    print(head + "  data until")
    for r in found:
        end = "-" if r["end_ms"] is None else iso(r["end_ms"])
        print(
            f"{r['version']:>7}  {iso(r['created_ms']):<24} {r['kind']:<8} {r['archive']:<16} {r['slices']:>8,} "
            f"{r['records']:>14,}  {end}"
        )
    return 0
