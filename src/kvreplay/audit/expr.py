"""`--fail-on EXPR`: a small, safe expression language over an audit record's fields.

    recompute_ratio > 0.05
    status == 'KV-block bound' or kv_time_ge95 >= 0.2
    preemptions_replayed > 10 and not prefix_caching
    status in ('KV-block bound', 'single-sequence-length bound')

Allowed: field names (the record's scalar columns), numbers, 'strings', true/false/null,
comparisons (== != < <= > >=, in, not in, chainable), and/or/not, + - * / % and
parentheses. Nothing else: no calls, attributes, subscripts or lambdas. The text is parsed
with Python's `ast` and walked by the interpreter below; it is never passed to eval.

Nulls: a comparison that involves a null field is false (SQL-like), except `== null` /
`!= null`; arithmetic with null gives null; division by zero gives null.
"""

from __future__ import annotations

import ast
import difflib
import operator
from typing import Any, Iterable

from kvreplay.errors import UserError

MAX_LEN = 1000

_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Mod: operator.mod}
_CONST_NAMES = {"true": True, "false": False, "null": None, "none": None,
                "True": True, "False": False, "None": None}
_WHAT = {ast.Call: "function calls", ast.Attribute: "attribute access (a.b)",
         ast.Subscript: "indexing (a[b])", ast.Lambda: "lambda", ast.IfExp: "if/else",
         ast.ListComp: "comprehensions", ast.GeneratorExp: "comprehensions",
         ast.DictComp: "comprehensions", ast.SetComp: "comprehensions", ast.Dict: "dicts",
         ast.Starred: "*", ast.NamedExpr: ":=", ast.JoinedStr: "f-strings",
         ast.Await: "await", ast.BitAnd: "&", ast.BitOr: "|", ast.Pow: "**"}


class ExprError(UserError):
    """A bad --fail-on expression (exit 2)."""


class Expr:
    """A checked expression; `evaluate(record) -> bool`."""

    def __init__(self, text: str, fields: Iterable[str], *, nested: Iterable[str] = ()) -> None:
        self.text = text
        self.fields = list(fields)
        self._nested = set(nested)
        if not text or not text.strip():
            raise ExprError("--fail-on: empty expression")
        if len(text) > MAX_LEN:
            raise ExprError(f"--fail-on: expression longer than {MAX_LEN} characters")
        src = " ".join(text.replace("&&", " and ").replace("||", " or ").split())
        try:
            tree = ast.parse(src, mode="eval")
        except SyntaxError as exc:
            col = f" at column {exc.offset}" if exc.offset else ""
            raise ExprError(f"--fail-on: cannot parse {text!r}: {exc.msg}{col}") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # (NUL bytes, nesting past the parser's limit)
            raise ExprError(f"--fail-on: cannot parse {text!r}: {type(exc).__name__}") from None
        self._check(tree.body)
        self.tree = tree.body
        self.names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(_CONST_NAMES))

    def _check(self, node: ast.AST) -> None:
        lists: set[int] = set()  # the comparators of 'in' / 'not in'
        ok = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
              ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.In, ast.NotIn,
              *_CMP, *_BIN)
        for n in ast.walk(node):
            if not isinstance(n, ok):
                what = _WHAT.get(type(n), type(n).__name__)
                raise ExprError(f"--fail-on: {what} not allowed in {self.text!r} (use fields, numbers, "
                                "'strings', comparisons, and/or/not, + - * /)")
            if isinstance(n, ast.Constant) and not isinstance(n.value, (int, float, str, type(None))):
                raise ExprError(f"--fail-on: constant {n.value!r} not allowed")
            if isinstance(n, ast.Name) and n.id not in _CONST_NAMES:
                if n.id in self._nested:
                    raise ExprError(f"--fail-on: field {n.id!r} is a list; compare scalar fields")
                if n.id not in self.fields:
                    near = difflib.get_close_matches(n.id, self.fields, n=1)
                    hint = f" (did you mean {near[0]!r}?)" if near else ""
                    raise ExprError(f"--fail-on: unknown field {n.id!r}{hint}; fields: "
                                    + ", ".join(self.fields))
            if isinstance(n, ast.Compare):
                last = len(n.ops) - 1
                for i, (op, right) in enumerate(zip(n.ops, n.comparators)):
                    if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (ast.Tuple, ast.List)):
                        raise ExprError("--fail-on: 'in' needs a list, e.g. status in ('a', 'b')")
                    if isinstance(right, (ast.Tuple, ast.List)):
                        lists.add(id(right))
                        if i != last:
                            raise ExprError(f"--fail-on: a list ends its comparison in {self.text!r} "
                                            "(write 'a in (1, 2) and ...')")
            if isinstance(n, (ast.Tuple, ast.List)):
                for e in n.elts:
                    if not (isinstance(e, (ast.Constant, ast.Name))
                            or (isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant))):
                        raise ExprError(f"--fail-on: a list holds fields, numbers and 'strings' only, in {self.text!r}")
        for n in ast.walk(node):  # a list only as the right side of 'in' / 'not in'
            if isinstance(n, (ast.Tuple, ast.List)) and id(n) not in lists:
                raise ExprError(f"--fail-on: a list is only allowed after 'in' or 'not in', in {self.text!r}")

    def evaluate(self, record: dict[str, Any]) -> bool:
        try:
            return bool(self._eval(self.tree, record))
        except (TypeError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
            # (a record value of an unexpected type; the grammar above rules out the rest)
            raise ExprError(f"--fail-on: cannot evaluate {self.text!r}: {type(exc).__name__}: {str(exc)[:80]}") from None

    def _eval(self, n: ast.AST, rec: dict[str, Any]) -> Any:
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id in _CONST_NAMES:
                return _CONST_NAMES[n.id]
            return rec.get(n.id)
        if isinstance(n, (ast.Tuple, ast.List)):
            return [self._eval(e, rec) for e in n.elts]
        if isinstance(n, ast.BoolOp):
            if isinstance(n.op, ast.And):
                return all(self._eval(v, rec) for v in n.values)
            return any(self._eval(v, rec) for v in n.values)
        if isinstance(n, ast.UnaryOp):
            v = self._eval(n.operand, rec)
            if isinstance(n.op, ast.Not):
                return not v
            if v is None:
                return None
            self._number(v, n)
            return -v if isinstance(n.op, ast.USub) else +v
        if isinstance(n, ast.BinOp):
            a, b = self._eval(n.left, rec), self._eval(n.right, rec)
            if a is None or b is None:
                return None
            self._number(a, n)
            self._number(b, n)
            try:
                return _BIN[type(n.op)](a, b)
            except ZeroDivisionError:
                return None
        if isinstance(n, ast.Compare):
            left = self._eval(n.left, rec)
            for op, right_node in zip(n.ops, n.comparators):
                right = self._eval(right_node, rec)
                if isinstance(op, (ast.In, ast.NotIn)):
                    if left is None:
                        return False
                    res = (left in right) == isinstance(op, ast.In)
                elif isinstance(op, (ast.Eq, ast.NotEq)) and (left is None or right is None):
                    res = (left is right) == isinstance(op, ast.Eq)
                elif left is None or right is None:
                    return False
                else:
                    if isinstance(left, str) != isinstance(right, str):
                        raise ExprError(f"--fail-on: cannot compare text with a number in {self.text!r} "
                                        f"({left!r} vs {right!r})")
                    res = _CMP[type(op)](left, right)
                if not res:
                    return False
                left = right
            return True
        raise ExprError(f"--fail-on: cannot evaluate {ast.dump(n)}")  # unreachable after _check

    def _number(self, v: Any, n: ast.AST) -> None:
        if isinstance(v, str):
            raise ExprError(f"--fail-on: arithmetic on text in {self.text!r}")


def compile_fail_on(text: str) -> Expr:
    from kvreplay.audit.record import NESTED, SCALARS

    return Expr(text, SCALARS, nested=NESTED)
