"""Rows held as columns: `Table`, a sequence of records (a slots dataclass or a msgspec
Struct, e.g. facts.StatsPoint) whose fields are kept one column each, not one object per
row.

A long default log is mostly stats lines (8,640 a day per engine at vLLM's 10 s; the 1M-line
bench in bench/bench_parse_memory.py), and the facts keep one record per line for the whole
run. A record object with its own int and float objects costs ~250 bytes; held as columns a
row costs ~4-8 bytes a field: a column is nothing while every value is the first one (an
int, a string, None: the log's file, an absent V0 field; never a float), an array of machine ints
(4 then 8 bytes) or doubles while the values are such, None marked in a byte mask beside
it, and a list of the values themselves otherwise (a bool, an int past 64 bits, a mix of
types). Reading gives back equal records, made as they are reached (values of the same
type and value, -0.0 and nan included); records are read-only copies: a change to one is
not kept (`set_column` changes a column).
"""

from __future__ import annotations

import dataclasses
from array import array
from itertools import repeat
from operator import attrgetter
from typing import Any, Generic, Iterable, Iterator, Sequence, TypeVar, overload

T = TypeVar("T")

_CONST, _ARRAY, _LIST = 0, 1, 2
_WIDER = {"i": "q"}  # an int array's next width when a value does not fit


class Column(Sequence[Any]):
    """One field's values in row order (see the module docstring). Appended to, read by
    index or in order."""

    __slots__ = ("_n", "_mode", "_first", "_arr", "_none", "_list")

    def __init__(self, values: Iterable[Any] = ()) -> None:
        self._n = 0
        self._mode = _CONST
        self._first: Any = None  # the value of every row while constant
        self._arr: array | None = None
        self._none: bytearray | None = None  # 1 where the row's value is None (array mode)
        self._list: list[Any] | None = None
        for v in values:
            self.append(v)

    def append(self, v: Any) -> None:
        mode = self._mode
        if mode == _ARRAY:
            arr = self._arr
            if v is None:
                if self._none is None:
                    self._none = bytearray(self._n)
                self._none.append(1)
                arr.append(0)  # type: ignore[union-attr]
                self._n += 1
                return
            if v.__class__ is (float if arr.typecode == "d" else int):  # type: ignore[union-attr]
                try:
                    arr.append(v)  # type: ignore[union-attr]
                except OverflowError:  # an int past the array's width: wider, else a list
                    wider = _WIDER.get(arr.typecode)  # type: ignore[union-attr]
                    if wider is None:
                        self._to_list()
                    else:
                        self._arr = array(wider, arr)  # type: ignore[arg-type]
                    return self.append(v)
                if self._none is not None:
                    self._none.append(0)
                self._n += 1
                return
            self._to_list()
            mode = _LIST
        if mode == _LIST:
            self._list.append(v)  # type: ignore[union-attr]
            self._n += 1
            return
        # constant so far
        first = self._first
        if self._n == 0 or first.__class__ is not float and (
                v is first or v.__class__ is first.__class__ and v.__class__ in (int, str) and v == first):
            if self._n == 0:
                self._first = v
            self._n += 1
            return
        # the first other value: an array if the rows so far and this one fit one
        cls = first.__class__ if first is not None else v.__class__
        if cls in (int, float) and v.__class__ in (cls, type(None)) and first.__class__ in (cls, type(None)):
            arr = _filled(cls, 0 if first is None else first, self._n)
            if arr is not None:
                self._mode, self._arr = _ARRAY, arr
                if first is None:
                    self._none = bytearray(b"\x01") * self._n
                return self.append(v)
        self._mode = _LIST
        self._list = [first] * self._n
        self._list.append(v)
        self._n += 1

    def extend(self, values: Sequence[Any]) -> None:
        """Append many (a Table's rows, a block at a time): one C call when they are all of
        the array's type, or all the constant itself; else one by one."""
        mode = self._mode
        if mode == _ARRAY and self._none is None:
            arr = self._arr
            if set(map(type, values)) == {float if arr.typecode == "d" else int}:  # type: ignore[union-attr]
                n = len(arr)  # type: ignore[arg-type]
                try:
                    arr.extend(values)  # type: ignore[union-attr]
                    self._n += len(values)
                    return
                except OverflowError:
                    del arr[n:]  # type: ignore[index]  (the values before the one that did not fit)
        elif mode == _LIST:
            self._list.extend(values)  # type: ignore[union-attr]
            self._n += len(values)
            return
        elif mode == _CONST and self._n and self._first.__class__ is not float:
            first = self._first
            if all(v is first for v in values):
                self._n += len(values)
                return
        for v in values:
            self.append(v)

    def _to_list(self) -> None:
        self._list = list(self)
        self._arr = self._none = None
        self._mode = _LIST

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError("column index out of range")
        if self._mode == _CONST:
            return self._first
        if self._mode == _LIST:
            return self._list[i]  # type: ignore[index]
        if self._none is not None and self._none[i]:
            return None
        return self._arr[i]  # type: ignore[index]

    def __iter__(self) -> Iterator[Any]:
        if self._mode == _CONST:
            return repeat(self._first, self._n)
        if self._mode == _LIST:
            return iter(self._list)  # type: ignore[arg-type]
        if self._none is None:
            return iter(self._arr)  # type: ignore[arg-type]
        return (None if m else v for v, m in zip(self._arr, self._none))  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        """Bytes its values take beyond the column itself (arrays, mask, list slots)."""
        if self._mode == _ARRAY:
            return self._arr.itemsize * len(self._arr) + len(self._none or b"")  # type: ignore[union-attr]
        return 8 * len(self._list) if self._mode == _LIST else 0  # type: ignore[arg-type]

    def __getstate__(self) -> tuple:
        return (self._n, self._mode, self._first, self._arr, self._none, self._list)

    def __setstate__(self, s: tuple) -> None:
        self._n, self._mode, self._first, self._arr, self._none, self._list = s

    def __repr__(self) -> str:
        kind = ("constant", f"array {self._arr.typecode if self._arr else ''}", "list")[self._mode]
        return f"Column({self._n} values, {kind})"


def _filled(cls: type, value: Any, n: int) -> array | None:
    """An array of n times `value` (a float: doubles; an int: the narrowest that holds it)."""
    for code in ("d",) if cls is float else ("i", "q"):
        try:
            return array(code, [value]) * n
        except OverflowError:
            continue
    return None


def _names(cls: type) -> tuple[str, ...]:
    names = getattr(cls, "__struct_fields__", None)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
    return names


class Table(Sequence[T], Generic[T]):
    """Records of one type `cls` in order, held as a `Column` per field; records are made
    positionally (`cls(*values)`) as they are read. Rows are appended to a block of up to
    BLOCK tuples, moved into the columns a block at a time (or before any read)."""

    BLOCK = 4096
    __slots__ = ("_cls", "_names", "_cols", "_n", "_pending", "_get", "_defaults")

    def __init__(self, cls: type[T], rows: Iterable[T] = ()) -> None:
        self._cls = cls
        self._names = _names(cls)
        self._cols = {name: Column() for name in self._names}
        self._n = 0
        self._pending: list[tuple] = []
        get = attrgetter(*self._names)
        self._get = get if len(self._names) > 1 else (lambda row: (get(row),))
        self._defaults = _defaults(cls, self._names)
        for r in rows:
            self.append(r)

    def append(self, row: T) -> None:
        self._pending.append(self._get(row))
        if len(self._pending) >= self.BLOCK:
            self._flush()

    def add(self, **values: Any) -> None:
        """Append a row given by field (a field not given: its default)."""
        row = {**self._defaults, **values}
        if row.keys() != self._cols.keys():
            bad = sorted(row.keys() ^ self._cols.keys())
            raise TypeError(f"{self._cls.__name__}: {'missing' if bad[0] in self._cols else 'no field'} {bad[0]}")
        self._pending.append(tuple(map(row.__getitem__, self._names)))
        if len(self._pending) >= self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        rows = self._pending
        if rows:
            for col, values in zip(self._cols.values(), zip(*rows)):
                col.extend(values)
            self._n += len(rows)
            self._pending = []

    def column(self, name: str) -> Column:
        """A field's values in row order (read-only: use `set_column` to change them)."""
        self._flush()
        return self._cols[name]

    def set_column(self, name: str, values: Iterable[Any]) -> None:
        """Replace a field's values (one per row)."""
        self._flush()
        col = Column(values)
        if len(col) != self._n:
            raise ValueError(f"{name}: {len(col)} values for {self._n} rows")
        self._cols[name] = col

    def __len__(self) -> int:
        return self._n + len(self._pending)

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i):
        self._flush()
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError("table index out of range")
        return self._cls(*[col[i] for col in self._cols.values()])

    def __iter__(self) -> Iterator[T]:
        self._flush()
        return map(self._cls, *self._cols.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    @property
    def nbytes(self) -> int:
        """Bytes its columns' values take (see Column.nbytes)."""
        self._flush()
        return sum(c.nbytes for c in self._cols.values())

    def __reduce__(self):  # (a process pool's argument: the columns, not the records)
        self._flush()
        return (_rebuild, (self._cls, self._n, self._cols))

    def __repr__(self) -> str:
        return f"Table({self._cls.__name__}, {len(self)} rows)"


def _defaults(cls: type, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields' defaults (a msgspec Struct's last ones; a dataclass's plain defaults)."""
    defaults = getattr(cls, "__struct_defaults__", None)
    if defaults is not None:
        return dict(zip(names[len(names) - len(defaults):], defaults))
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _rebuild(cls: type, n: int, cols: dict[str, Column]) -> Table:
    t = Table(cls)
    t._n, t._cols = n, cols
    return t
