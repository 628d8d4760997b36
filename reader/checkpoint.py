"""A replay's position as a value: what has been emitted, of which archive.

A checkpoint names its archive by its id (`Manifest.archive`, kept by appends), as the
Spark source's offsets do: resuming against an archive recompacted with other groups or
slices would otherwise skip or repeat records without a word. A later version of the same
archive only adds slices, so a checkpoint resumes on it. It holds no thread count, so a
replay can resume with any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keygroups import compacted
from reader.errors import CheckpointError

CHECKPOINT_VERSION = 2  # 2: the archive's fingerprint; 1 (slice count only) is refused
State = dict[str, Any]  # a checkpoint as `Replay.checkpoint()` returns it and `resume=` takes it (JSON)


@dataclass(frozen=True)
class Checkpoint:
    archive: str  # the archive's id
    url: str  # where the archive was, for messages only
    slices: int
    slice: int = 0  # the slice being replayed; == slices when done
    groups: dict[int, int] = field(default_factory=dict)  # records of each group already emitted in `slice`
    watermark: int | None = None  # the last watermark emitted

    def to_json(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "archive": self.archive,
            "url": self.url,
            "slices": self.slices,
            "slice": self.slice,
            "groups": {str(g): n for g, n in sorted(self.groups.items()) if n},
            "watermark": self.watermark,
        }

    @classmethod
    def from_json(cls, state: Any) -> Checkpoint:
        if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(
                f"checkpoint version {found!r}; this keyfill reads version {CHECKPOINT_VERSION} (start the replay "
                "anew, or resume with the keyfill that wrote it)"
            )
        try:
            cp = cls(
                archive=str(state["archive"]),
                url=str(state.get("url", "")),
                slices=int(state["slices"]),
                slice=int(state["slice"]),
                groups={int(g): int(n) for g, n in state.get("groups", {}).items()},
                watermark=None if state.get("watermark") is None else int(state["watermark"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise CheckpointError(f"malformed checkpoint ({type(exc).__name__}: {exc})") from None
        if not 0 <= cp.slice <= cp.slices or any(n < 0 for n in cp.groups.values()):
            raise CheckpointError(f"malformed checkpoint: slice {cp.slice} of {cp.slices}")
        return cp

    def check(self, manifest: compacted.Manifest, url: str) -> None:
        """Refuse to resume against another archive than the one this position is in."""
        here = manifest.archive
        if self.archive != here:
            raise CheckpointError(
                f"checkpoint is for archive {self.archive} ({self.url}), but {url} is archive {here} "
                "(recompacted since?): start the replay anew, or point it at the archive it started on"
            )
        if self.slices > manifest.slices:
            raise CheckpointError(
                f"checkpoint is at slice {self.slice} of {self.slices}, but {url} version {manifest.version} has "
                f"{manifest.slices} slices: resume against the version it was taken on, or a later one"
            )
        if any(not 0 <= g < manifest.groups for g in self.groups):
            raise CheckpointError(f"malformed checkpoint: groups outside archive {here} ({url})")
