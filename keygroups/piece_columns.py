"""Pieces column-wise: index rows as one numpy array, for readers that go through thousands
of pieces a second.

A replay of 10 s slices goes through that many. As a Python object per piece
(`pieces.Piece`), building them, walking them to plan GETs and decode steps, and the garbage
collections they set off were a noticeable share of a replay, all of it holding the GIL the
replay threads share (docs/performance.md#index-rows-as-columns). As columns, that is a few
numpy calls per index row group, per span and per decode step. A `Piece` is still built for
one piece when something needs its fields (an error names it, the drift-bound path reads per
piece): `PieceColumns` is a sequence of Pieces, built on access.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups.pieces import Piece

NUMBERS = tuple(f for f in Piece._fields if f != "file")  # the numeric fields of a Piece
FIELDS = ("file_id", *NUMBERS)  # rows of `PieceColumns.a`; a piece's file is an id in `Files`


class Files:
    """File names by id, shared by all the columns a reader builds, so that joining the
    pieces of two index row groups needs no renumbering. Ids are only ever added."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def ids(self, names: Iterable[str]) -> np.ndarray:
        out = []
        with self._lock:
            for n in names:
                i = self._ids.get(n)
                if i is None:
                    i = self._ids[n] = len(self.names)
                    self.names.append(n)
                out.append(i)
        return np.array(out, np.int64)


def _column(name: str) -> property:
    i = FIELDS.index(name)
    return property(lambda self: self.a[i], doc=f"the pieces' {name}")


class PieceColumns(Sequence[Piece]):
    """Index rows of pieces: `a[k]` is the FIELDS[k] of every piece, `files` names the files
    of the file_id row. Consecutive pieces (`rows`) are a view, not a copy."""

    __slots__ = ("files", "a")

    file_id = _column("file_id")
    slice = _column("slice")
    group = _column("group")
    offset = _column("offset")
    length = _column("length")
    records = _column("records")
    min_timestamp = _column("min_timestamp")
    max_timestamp = _column("max_timestamp")
    crc32c = _column("crc32c")
    file_header = _column("file_header")
    file_bytes = _column("file_bytes")

    def __init__(self, files: Files, a: np.ndarray) -> None:
        self.files, self.a = files, a

    @classmethod
    def of_table(cls, table: pa.Table, files: Files | None = None) -> PieceColumns:
        """PIECE_SCHEMA rows, in table order."""
        files = files or Files()
        names = pc.dictionary_encode(table.column("file")).combine_chunks()
        ids = files.ids(names.dictionary.to_pylist())[names.indices.to_numpy(zero_copy_only=False)]
        return cls(files, np.stack([ids, *(table.column(name).to_numpy() for name in NUMBERS)], dtype=np.int64))

    @classmethod
    def of(cls, pieces: Sequence[Piece]) -> PieceColumns:
        if isinstance(pieces, PieceColumns):
            return pieces
        files = Files()
        ids = files.ids(p.file for p in pieces)
        rows = [[getattr(p, name) for p in pieces] for name in NUMBERS]
        return cls(files, np.array([ids.tolist(), *rows], np.int64).reshape(len(FIELDS), len(pieces)))

    @classmethod
    def concat(cls, parts: list[PieceColumns]) -> PieceColumns:
        """Parts one after another (a span that crosses index row groups)."""
        if len(parts) == 1:
            return parts[0]
        files = parts[0].files
        if any(p.files is not files for p in parts):
            raise ValueError("pieces of different readers' file tables")
        return cls(files, np.concatenate([p.a for p in parts], axis=1))

    def rows(self, a: int, b: int) -> PieceColumns:
        """Pieces a..b-1 (a view)."""
        return PieceColumns(self.files, self.a[:, a:b])

    def take(self, idx: np.ndarray) -> PieceColumns:
        """The pieces at positions `idx` (a copy)."""
        return PieceColumns(self.files, self.a[:, idx])

    @property
    def end(self) -> np.ndarray:
        end: np.ndarray = self.offset + self.length
        return end

    def file_of(self, i: int) -> str:
        name: str = self.files.names[self.a[0, i]]
        return name

    def __len__(self) -> int:
        n: int = self.a.shape[1]
        return n

    @overload
    def __getitem__(self, i: int) -> Piece: ...

    @overload
    def __getitem__(self, i: builtins.slice) -> PieceColumns: ...

    def __getitem__(self, i: int | builtins.slice) -> Piece | PieceColumns:
        if isinstance(i, builtins.slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                raise ValueError("PieceColumns slices take consecutive pieces")
            return self.rows(a, b)
        file_id, *numbers = self.a[:, i].tolist()  # IndexError past either end
        return Piece(numbers[0], numbers[1], self.files.names[file_id], *numbers[2:])

    def __iter__(self) -> Iterator[Piece]:
        return (self[i] for i in range(len(self)))


def rows_fine(col: PieceColumns, groups: int) -> np.ndarray:
    """`Piece.check` column-wise, for a reader loading thousands of rows at once: which rows
    pass. Keep the two in step; `Piece.check` names what is wrong with a row that does not."""
    fine: np.ndarray = (
        (col.group >= 0)
        & (col.group < groups)
        & (col.file_header > 0)
        & (col.file_header <= col.offset)
        & (col.length > 0)
        & (col.offset + col.length <= col.file_bytes)
        & (col.records >= 1)
    )
    return fine
