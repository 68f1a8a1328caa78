"""Log files on different clocks: several files are replayed as one server's log, merged
by time, and a clock that is off merges them into nonsense (issue 31: the same requests
twice, hours of idle steps). Checked per pair of files, on what each line says:

- the same requests (ids of `Received request` lines) in both files: one log given twice,
  on the same clock or shifted by a constant (a copy from another host's clock); or ids
  reused at unrelated times. Never one server's log: refused.
- both files log the same engine's stats lines over the same stretch of time (longer than
  OVERLAP_WARN_S): a server writes one stats line per interval per engine, so these are two
  servers or one file's clock is off by that much. Refused.
- both files log stats lines and one starts before the other ends: longer than
  OVERLAP_WARN_S, refused as above; up to it (rotated parts of one log on clocks a little
  apart), merged by time as logged, with a warning saying how far the clocks may be apart.
  (A file without stats lines, e.g. an engine-core log beside its API server's, runs over
  the same time by design.)
"""

from __future__ import annotations

from statistics import median
from typing import Any, Sequence

from kvreplay.errors import UserError

SAME_SHIFT_S = 2.0  # duplicated requests all this close to one shift: a constant clock offset
SAME_CLOCK_S = 1.0  # ... and a shift this small is the same clock (whole-second stamps)
OVERLAP_WARN_S = 30.0  # files overlapping at most this long: a clock offset, merged as is


def check_clocks(by_file: dict[str, list[Any]]) -> list[str]:
    """Refuse (UserError) files that cannot be one server's log because of their clocks;
    return one warning line per pair that can, but overlaps a little."""
    warnings: list[str] = []
    files = list(by_file)
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            _duplicates(a, by_file[a], b, by_file[b])
            w = _overlap(a, by_file[a], b, by_file[b])
            if w:
                warnings.append(w)
    return warnings


def _received(evs: Sequence[Any]) -> dict[str, float]:
    from kvreplay import events as ev

    out: dict[str, float] = {}
    for e in evs:
        if isinstance(e, ev.RequestReceived) and e.time is not None:
            out.setdefault(e.request_id, e.time)
    return out


def _duplicates(a: str, ea: Sequence[Any], b: str, eb: Sequence[Any]) -> None:
    ra, rb = _received(ea), _received(eb)
    shared = sorted(set(ra) & set(rb))
    if not shared:
        return
    diffs = sorted(rb[k] - ra[k] for k in shared)
    shift = median(diffs)
    n = len(shared)
    what = f"{n} request{'s' if n != 1 else ''}"
    if diffs[-1] - diffs[0] <= SAME_SHIFT_S:
        if abs(shift) <= SAME_CLOCK_S:
            raise UserError(f"{b} logs the same {what} as {a} at the same times: one log "
                            "given twice, not one server's files; give it once")
        raise UserError(f"{b} logs the same {what} as {a}, each {shift:+.1f} s later: one log "
                        "given twice on clocks that differ (a copy from another host?), not "
                        "one server's files; give it once")
    raise UserError(f"{a} and {b} both log {what} with the same ids, at times "
                    f"{diffs[0]:+.1f} .. {diffs[-1]:+.1f} s apart: not one server's log; "
                    "replay each on its own")


def _stats_span(evs: Sequence[Any]) -> dict[int, tuple[float, float]]:
    """Per engine: the first and last stats line's time."""
    from kvreplay import events as ev

    out: dict[int, tuple[float, float]] = {}
    for e in evs:
        if isinstance(e, ev.Stats) and e.time is not None:
            k = e.engine or 0
            lo, hi = out.get(k, (e.time, e.time))
            out[k] = (min(lo, e.time), max(hi, e.time))
    return out


def _span(evs: Sequence[Any]) -> tuple[float, float] | None:
    ts = [e.time for e in evs if e.time is not None]
    return (min(ts), max(ts)) if ts else None


def _overlap(a: str, ea: Sequence[Any], b: str, eb: Sequence[Any]) -> str | None:
    sa, sb = _stats_span(ea), _stats_span(eb)
    for k in sorted(set(sa) & set(sb)):
        lo = max(sa[k][0], sb[k][0])
        hi = min(sa[k][1], sb[k][1])
        if hi - lo > OVERLAP_WARN_S:
            raise UserError(
                f"{a} and {b} both log engine {k}'s stats lines over the same {hi - lo:.0f} s: "
                "a server logs one stats line per interval, so these are two servers or one "
                "file's clock is that far off; replay each on its own")
    ta, tb = _span(ea), _span(eb)
    if ta is None or tb is None:
        return None
    first, second = (a, b) if ta[0] <= tb[0] else (b, a)
    t1, t2 = (ta, tb) if first == a else (tb, ta)
    over = min(t1[1], t2[1]) - t2[0]
    if over <= 0 or not (sa and sb):
        return None  # one after the other, or one of them logs no stats (an API-server
        # log beside its engine core's runs over the same time by design)
    if over > OVERLAP_WARN_S:
        raise UserError(f"{second} starts {over:.0f} s before {first} ends, and both log stats "
                        "lines: two servers, or one file's clock is that far off, not parts "
                        "of one log; replay each on its own")
    return (f"{second} starts {over:.1f} s before {first} ends: parts of one log on clocks "
            f"up to {over:.1f} s apart? merged by time as logged")
