"""Invariant 5 as a property (docs/design.md): a compaction or an append that dies at any
write before its commit leaves no new version visible (the archive stays what it was, or
none), and its re-run commits what a run that never failed commits, byte for byte (bar the
run ids in file names).

Each example grows a source in steps (`test_append.growing_source`) and keeps two histories
of it side by side: one unbroken, one whose runs die at drawn writes and are run again. The
runs are in this process (`compact(cfg)`: the tasks and bytes of a Spark run, milliseconds
instead of a Spark job each); the failure is the hook of `tests/fault_injection.py`, a
destination store that fails, moved from "after the n-th segment file" to "at the n-th
write of any object": the assignment, any segment file or continued tail, any index file,
the version object."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_append import grow, growing_source
from test_reader import hypothesis_settings, source_table

from compactor.errors import NothingSealed
from compactor.job import CompactConfig, compact, prepare
from keygroups import compacted
from keygroups.storage import open_storage
from tests.fault_injection import DiesAfterSegmentFiles, InjectedFailure
from tests.records import canonical_version, replayed, sealed_slices, source_positions

pytestmark = pytest.mark.faults


class DiesAtWrite(DiesAfterSegmentFiles):
    """The run's destination, which fails at its `at`-th write (of any object: the write
    does not happen) and at every write after it, as a run that died there would write
    nothing more; with `at=None` it only counts the writes."""

    def __init__(self, inner, at: int | None) -> None:
        super().__init__(inner, files=0)
        self.at, self.writes = at, 0

    def _next(self, key: str) -> None:
        self.writes += 1
        if self.at is not None and self.writes >= self.at:
            raise InjectedFailure(f"injected failure at write {self.writes} ({key})")

    def write(self, key: str, data: bytes) -> None:
        self._next(key)
        self.inner.write(key, data)

    def write_after(self, key: str, base: str, data: bytes) -> None:
        self._next(key)
        self.inner.write_after(key, base, data)

    def create(self, key: str, data: bytes) -> None:
        self._next(key)
        self.inner.create(key, data)

    def delete(self, key: str) -> None:
        self._next(key)
        self.inner.delete(key)

    def delete_many(self, keys: list[str]) -> int:
        self._next(",".join(keys))
        return self.inner.delete_many(keys)


def run_with(cfg: CompactConfig, at: int | None) -> DiesAtWrite:
    """`compact(cfg)` in this process, its destination failing at write `at`; the store, which
    counted the writes the run made."""
    prepared = prepare(cfg)
    prepared.dest = dest = DiesAtWrite(prepared.dest, at)
    compact(cfg, None, prepared)
    return dest


@hypothesis_settings(25)
@given(case=growing_source(), data=st.data())
def test_a_run_killed_at_any_write_leaves_nothing_visible_and_its_rerun_writes_the_same_bytes(
    tmp_path_factory, case, data
):
    parts, duration, idle = case
    root = tmp_path_factory.mktemp("killed")
    src = open_storage(str(root / "src"))
    unbroken, broken = str(root / "a"), str(root / "b")
    written: dict[int, int] = {}
    want = None  # what the last version holds, from the source alone (tests/records.py)
    steps = len(next(iter(parts.values()))[2])
    for step in range(steps):
        grow(src, parts, written, step)
        cfg = dict(source=src.url, groups=3, slice_duration=duration, idle_after=idle, append=True)
        cfg["seal_all"] = step == steps - 1
        before = canonical_version(unbroken) if compacted.versions(open_storage(unbroken)) else None
        sealed = sealed_slices(
            source_positions(source_table(src.url)),
            CompactConfig(**cfg, dest=unbroken).slice_duration_ms,
            seal_all=cfg["seal_all"],
            idle_after_ms=CompactConfig(**cfg, dest=unbroken).idle_after_ms,
            after=want,
        )
        try:
            writes = run_with(CompactConfig(**cfg, dest=unbroken), None).writes
        except NothingSealed:
            assert sealed is None
            continue
        if data.draw(st.booleans(), label=f"kill the run of step {step}"):
            at = data.draw(st.integers(1, writes), label="at write")
            try:
                run_with(CompactConfig(**cfg, dest=broken), at)
            except InjectedFailure:
                pass
            else:
                raise AssertionError(f"a run whose write {at} of {writes} failed went on")
            store = open_storage(broken)
            if before is None:  # the first run: no archive at all
                assert compacted.versions(store) == []
            else:  # the version before, as it was, and it replays whole: what the source sealed then
                assert canonical_version(broken) == before
                got = replayed(broken)
                assert len(got) == len(set(got)) and set(got) == set(want.placed)
        compact(CompactConfig(**cfg, dest=broken))  # the re-run (or the only run)
        assert canonical_version(broken) == canonical_version(unbroken)
        want = sealed
