"""`keyfill report`: one self-contained HTML page about a compacted archive, for the
questions a summary line cannot answer at a glance: are the groups balanced, how are the
bytes spread over event time, which partitions hold records back, how fast does it replay.

The pictures are PNGs drawn by matplotlib (its object API, no pyplot state) and embedded as
data URLs, so the page opens anywhere, mailed or copied off a cluster, with no other file.
"""

from __future__ import annotations

import base64
import html
import io
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from keygroups import compacted
from keygroups.errors import KeyfillError
from keygroups.piece_index import PieceIndex
from keygroups.storage import open_storage

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class Throughput:
    """When each batch of a replay arrived (seconds since it started) and its records."""

    threads: int
    seconds: float = 0.0  # the replay's wall time
    arrivals: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    finished: bool = False  # the replay reached the archive's end within its time

    @property
    def records(self) -> int:
        return sum(self.rows)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


@dataclass
class ReportData:
    url: str
    manifest: compacted.Manifest
    slice_start_ms: np.ndarray
    slice_bytes: np.ndarray
    slice_records: np.ndarray
    replay: Throughput | None


def gather(url: str, *, replay_seconds: float = 10.0, threads: int = 4) -> ReportData:
    """Read the latest version's manifest and slice index, and replay for up to
    `replay_seconds` (0: no replay) to a null sink."""
    store = open_storage(url)
    manifest = compacted.load_manifest(store)
    rows = PieceIndex.of(store, manifest).slice_rows(0, manifest.slices, ["slice", "start_ms", "records", "bytes"])
    replay = throughput(url, replay_seconds, threads) if replay_seconds > 0 else None
    return ReportData(
        url=store.url,
        manifest=manifest,
        slice_start_ms=rows.column("start_ms").to_numpy(),
        slice_bytes=rows.column("bytes").to_numpy(),
        slice_records=rows.column("records").to_numpy(),
        replay=replay,
    )


def throughput(url: str, seconds: float, threads: int) -> Throughput:
    import reader

    out = Throughput(threads=threads)
    with reader.replay(url, threads=threads) as events:
        started = time.perf_counter()
        for ev in events:
            now = time.perf_counter() - started
            if isinstance(ev, reader.Records):
                out.arrivals.append(now)
                out.rows.append(ev.batch.num_rows)
            if now >= seconds:
                break
        else:
            out.finished = True
        out.seconds = time.perf_counter() - started
    return out


def _figures() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise KeyfillError("keyfill report draws with matplotlib: pip install 'keyfill[report]'") from None
    return Figure


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def charts(data: ReportData) -> list[tuple[str, str, str]]:
    """(title, caption, base64 PNG) of each picture."""
    Figure = _figures()
    m = data.manifest
    out = []

    fig = Figure(figsize=(9, 3.2))
    ax = fig.add_subplot()
    loads = np.asarray(m.group_payload_bytes, dtype=float) / 1e6
    ax.bar(np.arange(m.groups), loads, width=0.9, color="#4477aa")
    ax.axhline(loads.mean(), color="#cc6677", linewidth=1, label=f"mean {loads.mean():,.2f} MB")
    ax.set_xlabel("key group")
    ax.set_ylabel("payload (MB)")
    ax.legend(loc="best")
    balance = loads.max() / loads.mean() if loads.sum() else 1.0
    out.append(
        (
            "Group balance",
            f"Payload bytes per key group (the packing's weights). Largest / mean = {balance:.3f}; a replay with "
            "one thread per group takes as long as the largest group.",
            _png(fig),
        )
    )

    fig = Figure(figsize=(9, 3.2))
    ax = fig.add_subplot()
    # a step per slice, the last one drawn to its end
    when = np.append(data.slice_start_ms, data.slice_start_ms[-1:] + m.slice_duration_ms).astype("datetime64[ms]")
    ax.plot(when, np.append(data.slice_bytes, data.slice_bytes[-1:]) / 1e6, drawstyle="steps-post", linewidth=0.8)
    ax.set_xlabel("event time (slice start, UTC)")
    ax.set_ylabel("MB per slice")
    fig.autofmt_xdate()
    empty = int((data.slice_records == 0).sum())
    out.append(
        (
            "Bytes per slice over event time",
            f"{len(data.slice_bytes):,} slices of {m.slice_duration_ms / 1000:g} s, {empty:,} of them empty; the "
            f"largest holds {data.slice_bytes.max() / 1e6 if len(data.slice_bytes) else 0:,.2f} MB. Every reader "
            "finishes a slice before any starts the next, so a tall slice is a pause in the watermark.",
            _png(fig),
        )
    )

    fig = Figure(figsize=(9, 3.2))
    ax = fig.add_subplot()
    partitions = sorted(m.handoff)
    held = [m.held_back.get(p, 0) for p in partitions]
    ax.bar([str(p) for p in partitions], held, color="#ccbb44")
    ax.set_xlabel("partition")
    ax.set_ylabel("records held back")
    if m.held_back or not m.config.seal_all:
        caption = (
            f"{sum(held):,} records of slices not sealed yet when version {m.version} was committed, by partition. "
            "They wait for an append (the hand-off offsets point at them); a partition with none is ahead of the "
            "partition that holds the seal back."
        )
    else:
        caption = "Compacted with --seal-all: every record is published, none held back."
    out.append(("Records held back", caption, _png(fig)))

    if data.replay is not None:
        r = data.replay
        fig = Figure(figsize=(9, 3.2))
        ax = fig.add_subplot()
        # records delivered so far: the slope is the throughput, and a stall shows as a flat stretch
        t = np.array([0.0, *r.arrivals, r.seconds])
        done = np.cumsum([0, *r.rows, 0]) / 1e6
        ax.plot(t, done, drawstyle="steps-post", linewidth=1, color="#aa3377", label="records delivered")
        ax.plot(
            [0, r.seconds],
            [0, r.records / 1e6],
            color="#555555",
            linewidth=1,
            linestyle="--",
            label=f"mean {r.rate:,.0f} records/s",
        )
        ax.set_xlabel("seconds since the replay started")
        ax.set_ylabel("million records")
        ax.legend(loc="upper left")
        how = "the whole archive" if r.finished else f"its first {r.seconds:.1f} s"
        out.append(
            (
                "Replay throughput",
                f"A replay to a null sink with {r.threads} threads on this machine, {how}: {r.records:,} records, "
                f"{r.rate:,.0f} records/s. The first second includes opening the index and the first GETs.",
                _png(fig),
            )
        )
    return out


def _summary_rows(data: ReportData) -> list[tuple[str, str]]:
    m, t = data.manifest, data.manifest.totals
    created = np.datetime64(m.created_ms, "ms").astype(str).replace("T", " ")[:19] if m.created_ms else "unknown"
    end = t.end_ms
    return [
        ("archive", data.url),
        ("version", f"{m.version} ({m.kind}, committed {created} UTC)"),
        ("source", f"{m.source.url} ({m.source.format})"),
        ("records", f"{t.records:,} ({t.payload_bytes / 1e6:,.1f} MB payload)"),
        ("keys", f"{t.keys:,}"),
        ("groups", f"{m.groups}"),
        ("slices", f"{m.slices:,} of {m.slice_duration_ms / 1000:g} s ({t.empty_slices:,} empty)"),
        ("event time", f"{np.datetime64(m.bounds(0)[0], 'ms')} .. {np.datetime64(end, 'ms') if end else '-'} UTC"),
        ("files", f"{t.files:,} segment files, {t.file_bytes / 1e6:,.1f} MB, {t.pieces:,} pieces"),
        ("held back", f"{sum(m.held_back.values()):,} records (by partition below)"),
        ("made late", f"{t.made_late:,} records placed after their own slice (idle partitions)"),
    ]


def render(data: ReportData) -> str:
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _summary_rows(data))
    figures = "\n".join(
        f'<section><h2>{html.escape(title)}</h2><figure><img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{png}"><figcaption>{html.escape(caption)}</figcaption></figure></section>'
        for title, caption, png in charts(data)
    )
    title = f"keyfill report: {data.url}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 960px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; }} th {{ text-align: left; padding-right: 1.5em; font-weight: 600; }}
td, th {{ padding: 2px 0; vertical-align: top; }} img {{ max-width: 100%; }}
figcaption {{ color: #555; font-size: 0.9em; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
<table>
{rows}
</table>
{figures}
</body></html>
"""


def write_report(url: str, out: str, *, replay_seconds: float = 10.0, threads: int = 4) -> ReportData:
    data = gather(url, replay_seconds=replay_seconds, threads=threads)
    page = render(data)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as exc:
        raise KeyfillError(f"report {out}: cannot write ({exc.strerror})") from None
    return data
