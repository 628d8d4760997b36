"""`keyfill replay`: replay to a null sink, with progress and a checkpoint file."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from keyfill.cli.args import iso, non_negative_int, positive_int, time_ms
from reader.errors import CheckpointError
from reader.options import ReplayOptions

if TYPE_CHECKING:
    from reader.checkpoint import State
    from reader.lockstep import Replay

DEFAULTS = ReplayOptions()  # the flags are ReplayOptions' fields, with its defaults (docs/options.md)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a compacted archive to a null sink, with progress",
        description="Replay a compacted archive with T threads in slice lockstep and drop the records: measures "
        "replay speed and exercises checkpoints. With --checkpoint-file, the position is saved there after every "
        "watermark (and on interrupt) and a run resumes from it when the file exists.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("url", help="compacted archive")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=DEFAULTS.threads,
        help="reader threads (default: 2 a core, between 4 and 32)",
    )
    p.add_argument("--batch-size", type=positive_int, default=DEFAULTS.batch_size, help="records per batch")
    p.add_argument(
        "--watermark-bound-ms",
        type=non_negative_int,
        default=DEFAULTS.watermark_bound_ms,
        help="bounded out-of-orderness B of the watermarks (watermark = slice end - B)",
    )
    p.add_argument(
        "--read-ahead-bytes",
        type=non_negative_int,
        default=DEFAULTS.read_ahead_bytes,
        help="bytes fetched ahead, all threads together (at most a quarter of the memory left)",
    )
    p.add_argument(
        "--range-bytes", type=non_negative_int, default=DEFAULTS.range_bytes, help="largest GET; 0: a span in one GET"
    )
    p.add_argument(
        "--max-drift-ms", type=non_negative_int, help="pause threads this far ahead of the slowest in event time"
    )
    for which, what in (("starting", "from the first offset"), ("ending", "up to, not including, the first offset")):
        p.add_argument(
            f"--{which}-timestamp",
            type=time_ms,
            metavar="TIME",
            help=f"per partition, {what} whose timestamp is at or after TIME (epoch ms or ISO 8601, e.g. "
            "2026-08-01T00:00:00Z), as Spark's Kafka source's startingTimestamp/endingTimestamp",
        )
    p.add_argument("--checkpoint-file", help="save the position here; resume from it if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handle=handle)


class CheckpointFile:
    """`--checkpoint-file`: the position a replay resumes from, saved whole or not at all."""

    def __init__(self, path: str | None):
        import os

        self.path = path
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise CheckpointError(f"checkpoint file {path}: folder {folder} does not exist")

    def load(self) -> State | None:
        """The saved position, or None: no file given, or none there yet."""
        import os

        if not self.path or not os.path.exists(self.path):
            return None
        try:
            with open(self.path) as f:
                state: State = json.load(f)
                return state
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint file {self.path}: not a readable keyfill checkpoint ({exc}); delete it to start from "
                "the beginning"
            ) from None

    def save(self, state: State) -> None:
        import os

        if not self.path:
            return
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)  # a crash never leaves half a checkpoint
        except OSError as exc:
            raise CheckpointError(f"checkpoint file {self.path}: cannot save ({exc})") from None


def handle(args: argparse.Namespace) -> int:
    import time

    import reader

    checkpoints = CheckpointFile(args.checkpoint_file)
    resume = checkpoints.load()
    started = time.perf_counter()
    try:
        events = reader.replay(
            args.url,
            threads=args.threads,
            resume=resume,
            batch_size=args.batch_size,
            watermark_bound_ms=args.watermark_bound_ms,
            max_drift_ms=args.max_drift_ms,
            read_ahead_bytes=args.read_ahead_bytes,
            range_bytes=args.range_bytes,
            starting_timestamp=args.starting_timestamp,
            ending_timestamp=args.ending_timestamp,
        )
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint file {args.checkpoint_file}: {exc}") from None
    with events:
        records, watermark = _drain(events, checkpoints, progress=not (args.no_progress or args.json))
    seconds = time.perf_counter() - started
    summary = {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_second": round(records / seconds),
        "watermark": watermark,
        "threads": args.threads,
        "resumed": resume is not None,
        "max_spread_ms": events.max_spread_ms,
        "read_ahead_peak_bytes": events.budget.peak,  # fetched or decoded, not yet handed over, at most
    }
    if args.json:
        print(json.dumps(summary))
    else:
        last = "none" if watermark is None else iso(watermark)
        print(
            f"replayed {records:,} records in {seconds:.1f} s ({records / seconds:,.0f} records/s) with "
            f"{args.threads} threads; last watermark {last}; max event-time spread across threads "
            f"{events.max_spread_ms / 1000:.1f} s" + (" (resumed)" if resume else "")
        )
    return 0


def _drain(events: Replay, checkpoints: CheckpointFile, *, progress: bool) -> tuple[int, int | None]:
    """Every event of the replay to nowhere, the position saved at each watermark, on Ctrl-C
    and at the end; the records counted and the last watermark."""
    from tqdm import tqdm

    from reader.lockstep import Records

    records, watermark = 0, None
    total = None if events.bounds else events.manifest.totals.records  # bounded: not known up front
    bar = tqdm(total=total, unit="rec", unit_scale=True, desc="replay", disable=not progress, mininterval=0.5)
    try:
        for ev in events:
            if isinstance(ev, Records):
                records += ev.batch.num_rows
                bar.update(ev.batch.num_rows)
            else:
                watermark = ev.timestamp_ms
                bar.set_postfix_str(
                    f"watermark {iso(watermark)}, spread {events.spread_ms() / 1000:.1f} s", refresh=False
                )
                checkpoints.save(events.checkpoint())
    except KeyboardInterrupt:
        checkpoints.save(events.checkpoint())
        raise
    finally:
        bar.close()
    checkpoints.save(events.checkpoint())
    return records, watermark
