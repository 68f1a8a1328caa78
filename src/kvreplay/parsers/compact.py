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

from array import array
from bisect import bisect_right
from typing import Any, Iterable, Iterator, Sequence, overload

import msgspec

from kvreplay import events as ev

_FIELDS: tuple[str, ...] = ev.Stats.__struct_fields__
# the fields a server's stats lines mostly share (file, logger, process, engine ...): one
# tuple of them per distinct combination, numbered; a row holds the number and the rest
_CONTEXT: tuple[str, ...] = ("file", "lines", "level", "process", "pid", "engine", "source", "truncated", "repeat",
                             "era", "kv_device")
_REST: tuple[str, ...] = tuple(f for f in _FIELDS if f not in _CONTEXT)
_KEYS: tuple[str, ...] = ("kind", *_CONTEXT, *_REST)
# the row's floats the facts keep (their stats points): one object per distinct value, as
# the parser gives out (its float cache), so what is made from a long log's rows shares them
_SHARED_AT: tuple[int, ...] = tuple(1 + _REST.index(f) for f in ("time", "prompt_throughput", "generation_throughput",
                                                                 "gpu_kv_usage", "prefix_cache_hit_rate"))
_FLOATS_KEPT = 1 << 16  # distinct float values shared (a time stamp each second: 18 h of them)
_ROW = object()  # the place of a packed stats row in the list of events


class EventList(Sequence[Any]):
    """Events in order; `Stats` events packed (see the module docstring). Read-only."""

    __slots__ = ("_items", "_buf", "_ends", "_contexts", "_ids", "_rows_at", "_enc", "_dec", "_floats")

    def __init__(self, events: Iterable[Any] = ()) -> None:
        self._items: list[Any] = []
        self._buf = bytearray()
        self._ends = array("Q")  # end offset of each row in _buf
        self._contexts: list[tuple] = []
        self._ids: dict[tuple, int] = {}
        self._rows_at: array | None = None  # position in _items of each row (for indexing)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder()
        self._floats: dict[float, float] = {}
        for e in events:
            self.append(e)

    def append(self, e: Any) -> None:
        """Add an event at the end (a `Stats` is packed; its object is not kept)."""
        if type(e) is ev.Stats:
            ctx = tuple(getattr(e, f) for f in _CONTEXT)
            k = self._ids.get(ctx)
            if k is None:
                k = self._ids[ctx] = len(self._contexts)
                self._contexts.append(ctx)
            vals = [k, *(getattr(e, f) for f in _REST)]
            while vals[-1] is None:  # (the fields left out are None)
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
        floats = self._floats
        n = len(vals)
        for i in _SHARED_AT:
            if i < n:
                v = vals[i]
                if v.__class__ is float and v:  # (not 0.0 / -0.0: equal keys, two values)
                    f = floats.get(v)
                    if f is not None:
                        vals[i] = f
                    elif len(floats) < _FLOATS_KEPT:
                        floats[v] = v
        vals[0:1] = self._contexts[vals[0]]
        return msgspec.convert(dict(zip(_KEYS, ["stats", *vals])), ev.Stats)  # (4x Stats(**kw)'s speed)

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

    def __reduce__(self):  # (pickled as its events: a process pool, a cache)
        return (EventList, (list(self),))

    @property
    def packed(self) -> int:
        """How many stats rows are held packed."""
        return len(self._ends)

    def __repr__(self) -> str:
        return f"EventList({len(self._items)} events, {self.packed} stats rows packed)"

