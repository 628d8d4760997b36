"""`keyfill vacuum`: delete what no retained version of a compacted archive needs."""

from __future__ import annotations

import argparse
import json


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "vacuum",
        help="delete files no retained version of a compacted archive needs (dry run unless --delete)",
        description="Commits never delete: an --overwrite or a failed run leaves files behind. vacuum keeps the "
        "latest version and every version that was still the latest within --retain (a reader may have opened it "
        "then), and lists the files of expired versions and of runs that ended without committing (their lease, "
        "_runs/<run>.json, says they failed, or went unrenewed for 20 minutes). A compaction or append still "
        "running renews its lease, so its files are never listed, however long it runs; files no version or lease "
        "knows are never touched. Nothing is deleted without --delete.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument(
        "--retain", default="7d", help="keep versions that were the latest within this long ago (e.g. 12h, 7d, 0s)"
    )
    p.add_argument("--delete", action="store_true", help="delete the files listed (default: only list them)")
    p.add_argument("--json", action="store_true", help="print what is (or would be) deleted and kept as JSON")
    p.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from compactor.vacuum import plan_vacuum, vacuum
    from keyfill.cli.args import mb
    from keygroups.durations import parse_duration
    from keygroups.errors import OptionError
    from keygroups.storage import open_storage

    try:
        retain_ms = 0 if args.retain.strip() in ("0", "0s") else parse_duration(args.retain)
    except OptionError:
        raise OptionError(f"--retain {args.retain!r}: expected a duration like 0s, 12h, 7d") from None
    store = open_storage(args.url)
    plan = plan_vacuum(store, retain_ms)
    if args.json:
        doc = {
            "url": store.url,
            "deleted": bool(args.delete),  # false: a dry run, nothing deleted
            "files": [store.url_for(k) for k in plan.files],
            "bytes": plan.bytes,
            "retained": plan.retained,
            "expired": plan.expired,
            "kept_live": plan.kept_live,
            "kept_unknown": plan.kept_unknown,
        }
        if args.delete:
            vacuum(store, plan)
        print(json.dumps(doc, indent=2))
        return 0
    for key in plan.files:
        print(store.url_for(key))
    verb = "deleting" if args.delete else "would delete (dry run; pass --delete)"
    print(
        f"{verb} {len(plan.files):,} files, {mb(plan.bytes)}; keeping versions "
        f"{', '.join(map(str, plan.retained))}"
        + (f"; expiring versions {', '.join(map(str, plan.expired))}" if plan.expired else "")
        + (f"; {plan.kept_live:,} files of runs still writing kept" if plan.kept_live else "")
        + (f"; {plan.kept_unknown:,} files of runs no version or lease knows left alone" if plan.kept_unknown else "")
    )
    if args.delete:
        vacuum(store, plan)
    return 0
