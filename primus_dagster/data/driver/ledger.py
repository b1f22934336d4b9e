"""Compact per-task sets of batch ``first_row`` ints (the claim and consumed ledgers).

A driver of a run's ~4 M tasks keeps two ledgers; most tasks have a handful of batches whose
``first_row`` values arrive in increasing order. :class:`RowSet` stores them as a sorted
``array('q')`` (8 bytes per batch, no per-int Python objects), inserts with ``bisect``
(appending at the end in the common in-order case) and is only allocated for tasks that
have a claim at all.

Example::

    rows = RowSet()
    assert rows.add(0) and rows.add(1024) and not rows.add(0)
    assert 1024 in rows and rows.to_list() == [0, 1024]
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator


class RowSet:
    """A sorted set of non-negative ints backed by ``array('q')``."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[int] = ()) -> None:
        self._rows = array("q", sorted(set(int(r) for r in rows)))

    def add(self, row: int) -> bool:
        """Insert ``row``; True when it was not there yet."""
        rows = self._rows
        if not rows or row > rows[-1]:
            rows.append(row)
            return True
        i = bisect_left(rows, row)
        if i < len(rows) and rows[i] == row:
            return False
        rows.insert(i, row)
        return True

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, int):
            return False
        rows = self._rows
        i = bisect_left(rows, row)
        return i < len(rows) and rows[i] == row

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def copy(self) -> RowSet:
        out = RowSet()
        out._rows = array("q", self._rows)
        return out

    def to_list(self) -> list[int]:
        return self._rows.tolist()

    def to_tuple(self) -> tuple[int, ...]:
        return tuple(self._rows)

    def __repr__(self) -> str:
        return f"RowSet({self.to_list()})"
