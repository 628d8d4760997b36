"""What a replay reads and who reads it: groups balanced over threads by bytes, and each
slice's metadata fetched once for all threads (an empty slice needs no fetch)."""

from __future__ import annotations

import threading

import numpy as np

import keygroups
from keygroups import compacted
from keygroups.errors import FormatError
from keygroups.storage import Storage


class ReplayPlan:
    def __init__(self, store: Storage, manifest: compacted.Manifest, threads: int) -> None:
        self.store = store
        self.manifest = manifest
        self.group_bytes = np.asarray(manifest.group_payload_bytes, dtype=np.int64)
        if len(self.group_bytes):
            self.thread_of_group = keygroups.assign_threads(self.group_bytes, threads)
        else:
            self.thread_of_group = np.zeros(0, np.int32)
        self._metas: list[compacted.SliceMeta | None] = [None] * len(manifest.slices)
        self._lock = threading.Lock()

    @property
    def slices(self) -> int:
        return len(self.manifest.slices)

    def groups_of(self, t: int) -> set[int]:
        return {g for g in range(len(self.thread_of_group)) if self.thread_of_group[g] == t}

    def slice_meta(self, s: int) -> compacted.SliceMeta:
        meta = self._metas[s]
        if meta is not None:  # already loaded: no need to queue behind a fetch of another slice
            return meta
        with self._lock:
            if self._metas[s] is None:
                meta = compacted.slice_meta(self.store, self.manifest.slices[s])
                stray = [gf.group for gf in meta.groups if not 0 <= gf.group < len(self.thread_of_group)]
                if stray:  # no thread would read it: its records would be skipped without a word
                    raise FormatError(
                        f"{self.store.url_for(compacted.slice_meta_key(s))}: group {stray[0]} is not one of the "
                        f"manifest's {len(self.thread_of_group)} groups"
                    )
                self._metas[s] = meta
            return self._metas[s]
