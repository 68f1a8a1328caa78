"""Counts in words: "1 self-preemption", "2 self-preemptions" (every view says them so)."""

from __future__ import annotations


def count(n: int, one: str, many: str | None = None) -> str:
    """`n` and the noun in its number; `many` where the plural is not `one` + "s"."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
