"""A log's events held compactly: `EventList`, a sequence of events in file order whose
stats lines are kept as packed rows, not as objects.

A `Stats` event is a Struct of 36 fields (~300 bytes with its line number); a long log is
mostly stats lines (a default log, 10 s apart, 8,640 a day per engine; the 1M-line bench
in bench/bench_parse_memory.py). Held as one MessagePack row each in a shared buffer, its
strings (file, time text, level, process, source, era, KV device) numbered once per list,
a row costs ~60-90 bytes. Iterating gives back equal `Stats` events (made as they are
reached, ~2-4 us each); every other event is held as parsed (the same object).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from typing import Any, Iterable, Iterator, Sequence, overload

import msgspec

from kvreplay import events as ev

_FIELDS: tuple[str, ...] = ev.Stats.__struct_fields__
# fields whose values are strings: numbered in the list's string table (a row holds the number)
_STR: frozenset[int] = frozenset(i for i, f in enumerate(_FIELDS)
                                 if f in ("file", "time_text", "level", "process", "source", "note", "era",
                                          "kv_device"))
_FLOATS_KEPT = 1 << 16  # distinct float values shared (a time stamp each second: 18 h of them)
_ZERO, _NEG_ZERO = 0.0, -0.0
_ROW = object()  # the place of a packed stats row in the list of events


class EventList(Sequence[Any]):
    """Events in order; `Stats` events packed (see the module docstring). Read-only."""

    __slots__ = ("_items", "_buf", "_ends", "_strings", "_ids", "_rows_at", "_enc", "_dec", "_floats")

    def __init__(self, events: Iterable[Any] = ()) -> None:
        self._items: list[Any] = []
        self._buf = bytearray()
        self._ends = array("Q")  # end offset of each row in _buf
        self._strings: list[str] = []
        self._ids: dict[str, int] = {}
        self._rows_at: array | None = None  # position in _items of each row (for indexing)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder()
        # one float object per distinct value given out (as the parser's): what is made from
        # the events (the facts' stats points) shares them, as it did the parsed events'
        self._floats: dict[float, float] = {}
        for e in events:
            self.append(e)

    def append(self, e: Any) -> None:
        """Add an event at the end (a `Stats` is packed; its object is not kept)."""
        if type(e) is ev.Stats:
            vals = list(msgspec.structs.astuple(e))
            for i in _STR:
                s = vals[i]
                if s is not None:
                    k = self._ids.get(s)
                    if k is None:
                        k = self._ids[s] = len(self._strings)
                        self._strings.append(s)
                    vals[i] = k
            while vals and vals[-1] is None:  # (the fields left out are None)
                vals.pop()
            self._enc.encode_into(vals, self._buf, -1)
            self._ends.append(len(self._buf))
            self._items.append(_ROW)
            self._rows_at = None
        else:
            self._items.append(e)

    def _row(self, k: int) -> ev.Stats:
        a = self._ends[k - 1] if k else 0
        vals = self._dec.decode(memoryview(self._buf)[a:self._ends[k]])
        strings, floats = self._strings, self._floats
        kw = {}
        for i, (name, v) in enumerate(zip(_FIELDS, vals)):
            if v is None:
                continue
            if i in _STR:
                v = strings[v]
            elif type(v) is float:
                if v == 0.0:  # (0.0 and -0.0 are equal keys: each its own object)
                    v = _ZERO if math.copysign(1.0, v) > 0 else _NEG_ZERO
                    kw[name] = v
                    continue
                f = floats.get(v)
                if f is None:
                    if len(floats) < _FLOATS_KEPT:
                        floats[v] = v
                else:
                    v = f
            kw[name] = v
        return ev.Stats(**kw)

    def __iter__(self) -> Iterator[Any]:
        k = 0
        for x in self._items:
            if x is _ROW:
                yield self._row(k)
                k += 1
            else:
                yield x

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._items)))]
        x = self._items[i]
        if x is not _ROW:
            return x
        if self._rows_at is None:
            self._rows_at = array("Q", (j for j, y in enumerate(self._items) if y is _ROW))
        j = i % len(self._items)
        return self._row(bisect_right(self._rows_at, j) - 1)

    @property
    def packed(self) -> int:
        """How many stats rows are held packed."""
        return len(self._ends)

    def __repr__(self) -> str:
        return f"EventList({len(self._items)} events, {self.packed} stats rows packed)"

