"""Readers of the field values the event builders share: numbers with thousands separators,
Python bools, token id lists and Python string reprs (as vLLM logs them)."""

from __future__ import annotations

import ast

import msgspec

Fields = list[tuple[str, str]]


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _float(s: str) -> float:
    return float(s)


def _bool(s: str | None) -> bool | None:
    if s == "True" or s == "true":
        return True
    if s == "False" or s == "false":
        return False
    return None


_ids_decode = msgspec.json.Decoder(list[int]).decode
# NOTE: one int object per token id value, shared by every prompt that has it: a token is
# then a list slot (8 bytes) instead of a slot and its own int (36 bytes). A day's log of
# 100,000 logged prompts holds about 30M tokens of a vocabulary of at most ~256k ids.
_TOKEN_INTS: dict[int, int] = {}


def shared_ints(ids: list[int]) -> list[int]:
    """`ids` with each value's one shared int object (see _TOKEN_INTS)."""
    if len(_TOKEN_INTS) > 1 << 20:  # (not token ids: do not grow without end)
        return ids
    return list(map(_TOKEN_INTS.setdefault, ids, ids))


def _ids(text: str | None) -> list[int] | None:
    """`[1, 2, 3]` -> ints; None for `None`; a list cut by --max-log-len keeps its ints."""
    if text is None or text == "None" or not text.startswith("["):
        return None
    if text[-1] == "]":  # a well-formed JSON list of ints means the same here, decoded in C
        try:
            ids = _ids_decode(text)
        except msgspec.DecodeError:
            pass
        else:
            return shared_ints(ids)
    inner = text[1:-1].strip()
    if not inner:
        return []
    out = []
    for p in inner.split(","):
        p = p.strip()
        if p.lstrip("-").isdigit():
            out.append(int(p))
    return out


def _pystr(text: str | None) -> str | None:
    if text is None or text == "None":
        return None
    q = text[:1]
    if (q == "'" or q == '"') and "\\" not in text and text.find(q, 1) == len(text) - 1:
        return text[1:-1]  # what literal_eval gives (or its fallback) without escapes inside
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text[1:-1]
    return v if isinstance(v, str) else str(v)
