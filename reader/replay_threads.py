"""The replay's reader threads: each reads and decodes its key groups' pieces and hands
them, a step at a time, to the consumer through the slice merge (`reader.slice_merge`).

Without a drift bound a thread goes through its groups a decoded step at a time, the group
whose next piece is earliest first; under one, the threads meet at each slice with pieces and
merge their groups by event time (`reader.pacing`). The consumer (`reader.lockstep.Replay`)
starts them and yields what they hand over.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from keygroups import compacted
from keygroups.piece_columns import PieceColumns
from keygroups.piece_index import row_group_of
from keygroups.storage import Storage
from reader.errors import ReplayError
from reader.fetch import PieceFetcher, read_failed
from reader.pacing import Pacer
from reader.read_budget import ReadBudget, ReadStopped
from reader.replay_plan import ReplayPlan
from reader.slice_merge import Bundle, SliceMerge


class ReplayThreads:
    """What the reader threads share: the plan, the merge they hand steps to, the pacer, the
    read budget, and the position the replay resumed from (`skip`: records of each group
    emitted in slice `skip_slice` before the checkpoint). `fetchers`: one per thread, set by
    the consumer before it starts them."""

    def __init__(
        self,
        store: Storage,
        plan: ReplayPlan,
        merge: SliceMerge,
        pacer: Pacer,
        budget: ReadBudget,
        stop: threading.Event,
        *,
        threads: int,
        batch_size: int,
        skip: dict[int, int],
        skip_slice: int,
    ):
        self.store, self.plan, self.merge, self.pacer, self.budget, self.stop = store, plan, merge, pacer, budget, stop
        self.batch_size = batch_size
        self.skip, self.skip_slice = skip, skip_slice
        self.barrier = threading.Barrier(threads)  # only under a drift bound, inside a slice
        self.fetchers: list[PieceFetcher] = []

    def run(self, t: int, first: int) -> None:
        """Thread t's loop, from slice `first`: its failure reaches the consumer."""
        plan = self.plan
        fetcher = self.fetchers[t]
        # a thread about to wait for the read budget first says how far it has got: the
        # consumer may need only that to go on, and free the budget
        fetcher.on_wait = lambda s: self.merge.put(t, [], s)
        try:
            if self.pacer.max_drift_ms is None:
                self._hand_over_steps(t, fetcher, first)
                return
            for s, gap in plan.occupied_slices(first):  # under a drift bound the threads meet at slices with pieces
                if gap and not self.merge.put(t, [], s):  # past the empty slices before s, at once
                    return
                own = plan.thread_pieces(row_group_of(s), t).get(s, [])
                fetcher.prefetch(s)
                # No thread declares where slice s starts before every thread has finished
                # s - 1: the pacer would hold a thread of s - 1 back against it.
                self.barrier.wait()
                if own:  # event time starts at the earliest record it will emit, known from the index
                    self.pacer.begin_slice(t, min(p.min_timestamp for p in own))
                # Everyone declares where its slice starts before anyone emits: a thread that
                # began late would otherwise join below a bound the others already used.
                self.barrier.wait()
                self._hand_over_paced(t, fetcher, s, own)
                self.pacer.end_slice(t)
                if not self.merge.put(t, [], s + 1):  # at once: the others wait at the next barrier
                    return
            self.merge.put(t, [], plan.slices)  # past the empty slices at the end
        except (threading.BrokenBarrierError, ReadStopped):
            return
        except BaseException as exc:  # surfaces in the consumer
            self.merge.fail(exc)
            self.barrier.abort()

    def _hand_over_steps(self, t: int, fetcher: PieceFetcher, first: int) -> None:
        """Without a drift bound: thread t's groups a decoded step at a time, always the group
        whose next piece is earliest (so the thread's FIFO goes forward in slice order, and
        `through` is the earliest slice some group of it still has to hand over). Per step,
        not per piece: a 10 s slice's piece is a few KB, and per-piece work in every thread,
        each taking the GIL in turn, held them all back (`reader.slice_merge`)."""
        slices, merge, stop = self.plan.slices, self.merge, self.stop
        heap = [(first, g) for g in sorted(self.plan.groups_of(t))]  # (nothing of g left before, g)
        fetcher.prefetch(first)
        while heap:
            if stop.is_set():
                return
            s, g = heap[0]
            fetcher.prefetch(s)
            nxt = fetcher.next_slice(g, s)
            if nxt is None:  # nothing of g within the look-ahead: look again from where it stopped
                frontier = fetcher.frontier(g)
                if frontier >= slices:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, (frontier, g))
                if not merge.put(t, [], heap[0][0] if heap else slices):
                    return
                continue
            if nxt > s:
                heapq.heapreplace(heap, (nxt, g))
                continue
            step, batch, counts, held, partial = self._step(fetcher, g)
            numbers = step.slice.tolist()
            heapq.heapreplace(heap, (numbers[-1] + (not partial), g))  # a large piece goes on in its slice
            if not merge.put(t, [Bundle(batch, g, numbers, counts, held)], heap[0][0] if heap else slices):
                return
        merge.put(t, [], slices)  # says this thread is past every slice

    def _step(self, fetcher: PieceFetcher, g: int) -> tuple[PieceColumns, pa.RecordBatch, list[int], int, bool]:
        """Group g's next decoded step (`Decoded`, with its pieces' record counts); in the slice
        this replay resumed in, without the records emitted before its checkpoint."""
        p = fetcher.next_piece(g)  # what an error names
        step, batch, held, partial = self._call_naming(p, fetcher.step, g)
        counts = step.records.tolist()
        if p.slice == self.skip_slice:  # only a step's first piece can be: steps start at `first`
            skip = self._records_to_skip(p, p.records)  # of a large piece, what its first steps leave to skip
            cut = min(skip, counts[0])
            batch, counts[0], self.skip[g] = batch.slice(cut), counts[0] - cut, skip - cut
        return step, batch, counts, held, partial

    def _hand_over_paced(self, t: int, fetcher: PieceFetcher, s: int, own: list[compacted.Piece]) -> None:
        """Under a drift bound: this thread's groups merged by event time (each group in its
        own order), so its event time only moves forward within the slice, each batch waiting
        while the thread is too far ahead of the slowest."""
        ordered = []  # per group: its batches (row ranges) with a non-decreasing event-time key
        batches: dict[int, pa.RecordBatch] = {}
        held: dict[int, tuple[int, int]] = {}  # group -> (its last batch, the bytes its piece holds)
        for p in own:
            if self.stop.is_set():
                return
            batch, charge = self._read(fetcher, p, s == self.skip_slice)
            outgoing = self.pacer.cut(batch, self.batch_size)
            cuts = [(ts, p.group, i, a, b) for i, (ts, a, b) in enumerate(outgoing)]
            if cuts:
                ordered.append(cuts)
                held[p.group] = (len(cuts) - 1, charge)
            else:  # nothing left to emit (all before the checkpoint resumed from)
                self.budget.give(charge)
            batches[p.group] = batch
        for ts, g, i, a, b in heapq.merge(*ordered):
            self.pacer.pace(t, ts)
            last, charge = held[g]
            bundle = Bundle(batches[g].slice(a, b - a), g, [s], [b - a], charge if i == last else 0)
            if not self.merge.put(t, [bundle], s):
                return
            self.pacer.advance(t, ts)

    def _read(self, fetcher: PieceFetcher, p: compacted.Piece, resumed: bool = False) -> tuple[pa.RecordBatch, int]:
        """The piece's records, tagged with their group and checked against the index before
        any of them is emitted, and the bytes they hold; `resumed`: in the slice this replay
        resumed in, only those not emitted before its checkpoint."""
        batch, held = self._call_naming(p, fetcher.read, p)
        skip = self._records_to_skip(p, batch.num_rows) if resumed else 0
        return (batch.slice(skip) if skip else batch), held

    def _call_naming(self, p: compacted.Piece, read: Callable[..., Any], *args: Any) -> Any:
        """`read(*args)`, its failure raised as a ReplayError naming piece p (a FormatError
        names its own piece)."""
        try:
            return read(*args)
        except compacted.FormatError as exc:
            raise ReplayError(str(exc)) from exc
        except ReadStopped:
            raise
        except BaseException as exc:
            raise ReplayError(str(read_failed(self.store, p, exc))) from exc

    def _records_to_skip(self, p: compacted.Piece, records: int) -> int:
        """Records of piece p (of `records`) emitted before the checkpoint this replay resumed
        from: more than the piece has is a checkpoint of another archive or a damaged one."""
        skip = self.skip.get(p.group, 0)
        if skip > records:
            raise ReplayError(
                f"{p.where(self.store.url_for(p.file))}: the checkpoint says {skip} records were emitted, "
                f"the piece has {records}"
            )
        return skip
