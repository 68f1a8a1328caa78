"""The Lark side: load the .lark grammars (LALR, cached), read their sample lines, and turn a
parse tree into the ordered `(field, text)` list that the fast matchers also produce.

Parsers are built lazily, once per process. The Lark cache file (a pickle) goes to the user
cache dir (`$XDG_CACHE_HOME/kvreplay` or `~/.cache/kvreplay`) and is used only while that
directory is private (this user's, writable by no one else) and the file is this user's and writable by no
one else (`_cache_path`); otherwise the grammar is compiled in memory (~3 s for messages.lark,
~0.3 s from the cache).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterator

GRAMMAR_DIR = Path(__file__).resolve().parent
ENVELOPE_GRAMMAR = GRAMMAR_DIR / "envelope.lark"
MESSAGES_GRAMMAR = GRAMMAR_DIR / "messages.lark"

_SAMPLE = re.compile(r"^// sample(?: (\w+))?: (.*)$", re.M)


def grammar_samples(path: Path) -> list[tuple[str | None, str]]:
    """`(start, line)` for each `// sample[ start]: line` comment of a grammar file."""
    return [(m.group(1), m.group(2)) for m in _SAMPLE.finditer(path.read_text(encoding="utf-8"))]


def message_starts() -> list[str]:
    return sorted({k for k, _ in grammar_samples(MESSAGES_GRAMMAR) if k})


def _private_dir(d: str) -> bool:
    """Is `d` a real directory (not a link) owned by this user that no one else can write
    to? Creates it (0700) when missing."""
    import stat

    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else None
    return (stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid) and st.st_mode & 0o022 == 0
            and os.access(d, os.W_OK))


def _trusted_file(path: str) -> bool:
    """A cache file may be loaded (it is a pickle: loading runs code) only when it is a regular
    file, not a link, owned by this user and writable by no one else. A missing file is fine
    (Lark writes it)."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else None
    return stat.S_ISREG(st.st_mode) and (uid is None or st.st_uid == uid) and st.st_mode & 0o022 == 0


def _cache_path(path: Path, text: str) -> str | None:
    """The Lark cache file for a grammar, or None (compile in memory, ~3 s for messages.lark).

    Lark's cache is a pickle, so it is read only from a private directory (this user's, writable
    by no one else, not a link; checked on every use) and only when the file itself is this user's and writable by
    no one else: a file planted by another local user is never loaded. KVREPLAY_LARK_CACHE=0
    turns the cache off."""
    if os.environ.get("KVREPLAY_LARK_CACHE", "1") in ("0", "", "off", "no"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "kvreplay")
    if not _private_dir(d):
        return None
    import lark

    digest = hashlib.sha256((lark.__version__ + text).encode()).hexdigest()[:16]
    f = os.path.join(d, f"{path.stem}-{digest}.lark.cache")
    return f if _trusted_file(f) else None


def _build(path: Path, **kw: Any):
    import lark

    text = path.read_text(encoding="utf-8")
    cache = _cache_path(path, text + repr(sorted(kw.items())))
    try:
        return lark.Lark(text, parser="lalr", cache=cache or False, **kw)
    except OSError:  # cache dir vanished or read-only after all
        return lark.Lark(text, parser="lalr", **kw)


@functools.cache
def envelope_parser():
    return _build(ENVELOPE_GRAMMAR)


@functools.cache
def messages_parser():
    return _build(MESSAGES_GRAMMAR, start=message_starts(), propagate_positions=True)


def tree_fields(tree: Any, text: str) -> list[tuple[str, str]]:
    """Ordered fields of a Lark tree: terminals `F_NAME` and rules `f_name`, by source text."""
    from lark import Token, Tree

    out: list[tuple[str, str]] = []
    # depth first, children in order, with a stack of our own: a tree as deep as the line
    # is long (a cut line of 100,000 nested brackets) must not reach Python's recursion limit
    stack = [iter(tree.children)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
        elif isinstance(child, Token):
            if child.type.startswith("F_"):
                out.append((child.type[2:].lower(), str(child)))
        elif isinstance(child, Tree):
            name = str(child.data)
            if name.startswith("f_"):
                meta = child.meta
                out.append((name[2:], text[meta.start_pos:meta.end_pos]))
            else:
                stack.append(iter(child.children))
    return out


def lark_envelope_fields(line: str) -> list[tuple[str, str]] | None:
    """Envelope fields by Lark (reference path); None when the line is not a vLLM record."""
    from lark.exceptions import LarkError

    try:
        tree = envelope_parser().parse(line)
    except LarkError:
        return None
    return tree_fields(tree, line)


def lark_message_fields(kind: str, text: str) -> list[tuple[str, str]] | None:
    from lark.exceptions import LarkError

    try:
        tree = messages_parser().parse(text, start=kind)
    except LarkError:
        return None
    return tree_fields(tree, text)


# ------------------------------------------------------------------ Python repr payloads


def parse_pyrepr(text: str, start: str = "value") -> Any:
    """Python-repr payload (SamplingParams(...), Namespace(...), dict, key=value list) -> Python.

    Calls become dicts with the callee under "__call__"; enums `<A.B: 2>` become "A.B";
    bare words stay strings. Raises lark.exceptions.LarkError on text it cannot parse.
    """
    p = _pyrepr_parser()
    return _PyRepr().transform(p.parse(text, start=start))


@functools.cache
def _pyrepr_parser():
    return _build(MESSAGES_GRAMMAR, start=["value", "kwargs"], maybe_placeholders=False)


def _unquote(s: str) -> str:
    import ast

    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return s[1:-1]


def _number(s: str) -> int | float:
    try:
        return int(s)
    except ValueError:
        return float(s)


_NAMES = {"None": None, "True": True, "False": False}


def _make_pyrepr():
    from lark import Transformer

    class PyRepr(Transformer):
        def STRING(self, t):  # noqa: N802 - Lark callback names
            return _unquote(str(t))

        def NUMBER(self, t):  # noqa: N802
            return _number(str(t))

        def NAME(self, t):  # noqa: N802
            s = str(t)
            return _NAMES[s] if s in _NAMES else s

        def BARE(self, t):  # noqa: N802
            return str(t)

        def list(self, items):
            return [i for i in items if not _is_missing(i)]

        def tuple(self, items):
            return [i for i in items if not _is_missing(i)]

        def dict(self, items):
            return {k: v for k, v in (i for i in items if not _is_missing(i))}

        def pair(self, items):
            return (items[0], items[1])

        def enum(self, items):
            return items[0]

        def kwarg(self, items):
            return ("kw", str(items[0]), items[1] if len(items) > 1 else None)

        def posarg(self, items):
            return ("pos", None, items[0])

        def call(self, items):
            out: dict[str, Any] = {"__call__": str(items[0])}
            pos = []
            for a in items[1:]:
                if _is_missing(a):
                    continue
                if a[0] == "kw":
                    out[a[1]] = a[2]
                else:
                    pos.append(a[2])
            if pos:
                out["__args__"] = pos
            return out

        def kwargs(self, items):
            return {a[1]: a[2] for a in items if a[0] == "kw"}

    return PyRepr


def _is_missing(x: Any) -> bool:
    return False  # the pyrepr parser is built with maybe_placeholders=False


class _PyReprProxy:
    _cls = None

    def transform(self, tree):
        if _PyReprProxy._cls is None:
            _PyReprProxy._cls = _make_pyrepr()
        return _PyReprProxy._cls().transform(tree)


_PyRepr = _PyReprProxy


def iter_grammar_files() -> Iterator[Path]:
    yield ENVELOPE_GRAMMAR
    yield MESSAGES_GRAMMAR


# ------------------------------------------------------------------ lines cut short


CUT_MAX = 1 << 20  # characters of a cut line the LALR parse reads (~2 s of CPU)


def cut_fields(kind: str, text: str) -> list[tuple[str, str]] | None:
    """The fields of a message of `kind` that was cut short (terminal width, a paste limit, a
    crash), or None when `text` is not a cut sentence of the grammar.

    `text` is cut when the LALR parse fails only because the text ends: at the end itself,
    or where the rest could begin a terminal the parser expected there (a prefix of its
    literal, or of its regex with a literal look-ahead). The fields are those parsed before
    the cut, except one that reaches the end of the text (it may itself be cut: "0" of
    "0.0%"). Defined by messages.lark alone: the same answer on both routes."""
    from lark import Token, Tree
    from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    p = messages_parser()
    text = text.rstrip()[:CUT_MAX]  # (past CUT_MAX the line is read as cut there: time stays bounded)
    try:
        ip = p.parse_interactive(text, start=kind)
        for _ in ip.iter_parse():
            pass
        ip.feed_eof()
        return None  # a complete sentence: not cut (the matcher decides about it)
    except UnexpectedEOF:
        pos = len(text)
        expected: set[str] = set()
    except UnexpectedToken as e:
        if e.token.type == "$END":
            pos, expected = len(text), set()
        else:
            pos, expected = e.token.start_pos, set(e.expected)
    except UnexpectedCharacters as e:
        pos, expected = e.pos_in_stream, set(e.allowed or ())
    except LarkError:
        return None
    rest = text[pos:]
    names = {t.name for t in p.terminals}
    if rest and not any(_could_begin(p.get_terminal(name), rest) for name in expected if name in names):
        return None
    out: list[tuple[str, str]] = []
    stack = ip.parser_state.value_stack
    tail: list[tuple[str, str]] = []
    keep = _cut_keeps().get(kind)
    if keep is not None:  # a field whose text up to the cut is still usable
        stack, tail = _cut_tail(stack, text, *keep)
    for item in stack:
        if isinstance(item, Token):
            if item.type.startswith("F_") and item.end_pos is not None and item.end_pos < len(text):
                out.append((item.type[2:].lower(), str(item)))
        elif isinstance(item, Tree):
            fields = tree_fields(Tree("_", [item]), text)
            end = item.meta.end_pos if not item.meta.empty else 0
            if end < len(text):
                out += fields
    return out + tail


def _cut_tail(stack: list, text: str, name: str, literals: frozenset[str]) -> tuple[list, list[tuple[str, str]]]:
    """(stack before, [(name, text from its start to the cut)]) when the parse was cut inside
    the field that follows one of `literals` (no field after that literal), else (stack, [])."""
    from lark import Token, Tree

    for i in range(len(stack) - 1, -1, -1):
        it = stack[i]
        if isinstance(it, Token) and str(it) in literals:
            if i + 1 == len(stack):
                return stack, []
            nxt = stack[i + 1]
            start = nxt.start_pos if isinstance(nxt, Token) else nxt.meta.start_pos
            return stack[:i], [(name, text[start:])]
        if (isinstance(it, Token) and it.type.startswith("F_")) or (isinstance(it, Tree) and str(it.data).startswith("f_")):
            return stack, []
    return stack, []


_CUT_KEEPS = re.compile(r"^// cut-keeps (\w+) (\w+): (.*)$", re.M)


@functools.cache
def _cut_keeps() -> dict[str, tuple[str, frozenset[str]]]:
    """`// cut-keeps KIND FIELD: LITERAL ...` directives of messages.lark."""
    return {m.group(1): (m.group(2), frozenset(m.group(3).split()))
            for m in _CUT_KEEPS.finditer(MESSAGES_GRAMMAR.read_text(encoding="utf-8"))}


def _could_begin(term: Any, rest: str) -> bool:
    """Could `rest` (the end of a cut text) be the beginning of `term`'s match?"""
    pat = term.pattern
    if pat.type == "str":
        return pat.value.startswith(rest)
    rx = pat.to_regexp()
    m = re.fullmatch(r"(?s)(.*)\(\?=((?:[^()\\\[\]{}*+?|^$.]|\\.)*)\)", rx)  # a literal look-ahead at the end
    if m is None:
        return re.fullmatch(rx, rest) is not None
    main, ahead = m.group(1), re.sub(r"\\(.)", r"\1", m.group(2))
    # (rest[k:] longer than `ahead` cannot be its prefix: only the last len(ahead) + 1 cuts are
    # tried, so the time is linear in len(rest), not quadratic)
    for k in range(len(rest), max(0, len(rest) - len(ahead)) - 1, -1):
        if ahead.startswith(rest[k:]) and re.fullmatch(main, rest[:k]):
            return True
    return False
