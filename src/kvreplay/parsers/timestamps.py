"""The clock: vLLM's `MM-DD HH:MM:SS` time stamps and absolute (ISO) times -> epoch seconds."""

from __future__ import annotations

import calendar
import time as _time


class Clock:
    """MM-DD HH:MM:SS -> epoch seconds (local wall time read as UTC), year inferred, monotonic
    across a new year (a jump from Oct-Dec back to Jan-Mar adds a year)."""

    def __init__(self, year: int | None = None, ref: tuple[int, str] | None = None) -> None:
        if year is not None and not 1 <= year <= 9999:
            from kvreplay.errors import UserError

            raise UserError(f"--year {year}: must be between 1 and 9999")
        self.explicit = year is not None
        self.year = year
        self.ref = ref  # (year, "MM-DD") of the file's mtime: the log ends no later than that
        self.last_md: str | None = None
        self.cache: dict[str, float | None] = {}
        self._last_date = self._last_hms = None
        self._last_stamp: tuple[float | None, str] = (None, "")

    def hint_year(self, year: int) -> None:
        if not self.explicit and self.last_md is None and 1 <= year <= 9999:
            self.year = year
            self.explicit = True

    def stamp(self, date: str, hms: str) -> tuple[float | None, str]:
        """(epoch(date, hms), "date hms"), memoised for a repeated time stamp."""
        if hms == self._last_hms and date == self._last_date:
            return self._last_stamp
        r = self._last_stamp = (self.epoch(date, hms), f"{date} {hms}")
        self._last_date, self._last_hms = date, hms
        return r

    def epoch(self, date: str, hms: str) -> float | None:
        if date != self.last_md:
            self._last_hms = None  # the memo of stamp() is only valid within one date
            if self.year is None:
                if self.ref is None:
                    self.year = _time.gmtime().tm_year
                else:
                    ry, rmd = self.ref
                    self.year = ry if date <= rmd else ry - 1
            elif self.last_md is not None and date < self.last_md and self.last_md[:2] >= "10" and date[:2] <= "03":
                self.year += 1
                self.cache.clear()
            self.last_md = date
        key = date + hms
        t = self.cache.get(key, False)
        if t is False:
            t = self._compute(date, hms)
            self.cache[key] = t
        return t  # type: ignore[return-value]

    def _compute(self, date: str, hms: str) -> float | None:
        try:
            mon, day = int(date[:2]), int(date[3:5])
            hh, mm, ss = int(hms[:2]), int(hms[3:5]), int(hms[6:8])
        except ValueError:
            return None
        if not 1 <= self.year <= 9999:  # (a new year past 9999): no date; the line keeps its text
            return None
        if not (1 <= mon <= 12 and 1 <= day <= calendar.monthrange(self.year, mon)[1] and hh < 24 and mm < 60 and ss < 61):
            return None
        return float(calendar.timegm((self.year, mon, day, hh, mm, ss, 0, 0, 0)))


def _abs_time(text: str) -> float | None:
    """`2026-05-12T08:01:39.331Z` / `2026-05-07 10:00:05,123` -> epoch (UTC)."""
    try:
        y, mo, d = int(text[0:4]), int(text[5:7]), int(text[8:10])
        h, mi, s = int(text[11:13]), int(text[14:16]), int(text[17:19])
        frac = text[19:].rstrip("Z")
        f = float("0." + frac[1:]) if len(frac) > 1 and frac[0] in ".," and frac[1:].isdigit() else 0.0
        if not 1 <= y <= 9999:
            return None
        return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) + f
    except (ValueError, IndexError, OverflowError):
        return None


def _clock_for(year: int | None, mtime: float | None) -> Clock:
    if year is not None:
        return Clock(year=year)
    if mtime is None:
        return Clock()
    tm = _time.localtime(mtime)
    return Clock(ref=(tm.tm_year, f"{tm.tm_mon:02d}-{tm.tm_mday:02d}"))
