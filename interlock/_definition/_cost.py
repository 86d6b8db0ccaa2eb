"""What a CEL evaluation may cost, estimated before it runs.

The CEL implementation has no cost limit of its own, and it is not cheap: turning a
Python value into a CEL value costs 0.1-4 µs per object, an ``all`` iteration about
0.3 µs, and ``map``/``filter`` copy their result list on every append (quadratic: a
``map`` over 16 000 elements ran 13 s). So an expression that is harmless over a
small state can hold the event loop for minutes over a large one.

`CostModel` is built once per expression from its syntax tree (a small CEL parser,
`parse`). Before an evaluation whose context holds anything but numbers, booleans and
null, `CostModel.estimate` measures the values the expression reads (`measure`:
objects and characters, iteratively, stopping as soon as the total passes the limit)
and walks the tree with those sizes: every operator is charged what it may cost on
operands of that size (a comparison or ``in`` scans its operands, ``+`` copies them, a
macro runs its body once per element, ``map``/``filter`` also pay the quadratic copy),
and every result gets a size bound for the operators above it. The estimate is an
upper bound in *cost units* of about 10 ns each on the machine it was calibrated on
(bench/cel_bounds.py measures it); `_limits.EXPRESSION_COST` caps it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# -- weights, in cost units (~10 ns): see bench/cel_bounds.py ---------------------------

W_SCALAR = 25  # converting a number/bool/null into a CEL value
W_STR = 250  # converting a string object (plus its characters, CHARS_PER_UNIT a unit)
W_ENTRY = 300  # converting a map entry (the key's string and the entry itself)
W_CONTAINER = 50  # a list or map object
CHARS_PER_UNIT = 8  # characters copied, compared or scanned per cost unit
W_ITER = 40  # one iteration of a macro, besides its body
W_APPEND = 6  # map/filter: times (elements)^2, the copy of the accumulated list
W_OP = 2  # an operator on scalars
W_REGEX = 50  # compiling a regular expression, per character of its pattern

_SCALARS = frozenset({int, float, bool, type(None)})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


@dataclass(frozen=True, slots=True)
class Size:
    """A bound on a value: ``cost`` to convert (or copy) it, ``length`` the largest
    length of a list, map or string anywhere in it, ``elem`` the largest cost of one of
    its elements (what a macro's iteration variable may hold)."""

    cost: int
    length: int
    elem: int


SCALAR = Size(W_SCALAR, 1, 0)


def measure(value: Any, cap: int) -> Size:
    """The size of ``value``; stops (with a cost over ``cap``) once the cost passes it."""
    # The bound has three parts because the operators need three different things:
    # ``cost`` what converting the whole value costs (charged once per evaluation, and
    # again by anything that copies or scans it), ``length`` how many times a macro over
    # it may iterate, ``elem`` what one iteration variable may hold (a macro's body is
    # charged as if every element were the largest). Past ``cap`` the exact figure no
    # longer matters -- the evaluation is refused -- so measuring stops there.
    t = type(value)
    if t in _SCALARS:
        return SCALAR
    if t is str:
        return Size(W_STR + len(value) // CHARS_PER_UNIT, len(value), 0)
    longest = [0]  # a cell `_footprint` raises in place: the longest length seen inside
    if t is dict:
        children: Any = value.values()
    elif t is list or t is tuple:
        children = value
    else:  # another object (a node may write anything): costed as its text would be
        return Size(W_STR + len(repr(value)) // CHARS_PER_UNIT, 1, 0)
    longest[0] = len(value)
    if W_SCALAR * len(value) > cap:  # over before looking inside
        return Size(W_SCALAR * len(value) + 1, len(value), W_SCALAR)
    types = set(map(type, children))
    total = W_CONTAINER + (W_ENTRY * len(value) if t is dict else 0)
    elem = 0
    if types <= _SCALARS:  # plain values: counted at C speed
        total += W_SCALAR * len(value)
        elem = W_SCALAR
    elif types <= {str}:
        lengths = list(map(len, children))
        elem = W_STR + max(lengths, default=0) // CHARS_PER_UNIT
        total += W_STR * len(value) + sum(lengths) // CHARS_PER_UNIT
        longest[0] = max(longest[0], max(lengths, default=0))
    else:
        for child in children:  # one pass: each element's cost is a candidate for elem
            c = _footprint(child, cap - total, longest)
            total += c
            elem = max(elem, c)
            if total > cap:
                return Size(total, longest[0], total)
    if t is dict:
        lengths = [len(k) if type(k) is str else 1 for k in value]
        elem = max(elem, W_STR + max(lengths, default=0) // CHARS_PER_UNIT)
        total += W_STR * len(value) + sum(lengths) // CHARS_PER_UNIT
    return Size(total, longest[0], elem)


def _footprint(value: Any, cap: int, longest: list[int]) -> int:
    """The conversion cost of ``value``, iteratively, stopping past ``cap``."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t in _SCALARS:
            total += W_SCALAR
            continue
        if t is str:
            total += W_STR + len(v) // CHARS_PER_UNIT
            if len(v) > longest[0]:
                longest[0] = len(v)
            continue
        if t is dict:
            items: Any = v.values()
            keys = v.keys()
            if len(v) <= 8:
                total += W_CONTAINER + (W_STR + W_ENTRY) * len(v)
                for k in keys:
                    total += len(k) // CHARS_PER_UNIT if type(k) is str else W_SCALAR
                stack.extend(items)
                continue
            types = set(map(type, keys))
            if types <= {str}:
                total += (W_STR + W_ENTRY) * len(v) + sum(map(len, keys)) // CHARS_PER_UNIT
                longest[0] = max(longest[0], max(map(len, keys), default=0))
            else:
                stack.extend(keys)
                total += W_ENTRY * len(v)
        elif t is list or t is tuple:
            items = v
        else:
            total += W_STR + len(repr(v)) // CHARS_PER_UNIT
            continue
        total += W_CONTAINER
        if len(v) > longest[0]:
            longest[0] = len(v)
        types = set(map(type, items))  # lists of plain values: counted at C speed
        if types <= _SCALARS:
            total += W_SCALAR * len(v)
        elif types <= {str}:
            total += W_STR * len(v) + sum(map(len, items)) // CHARS_PER_UNIT
            longest[0] = max(longest[0], max(map(len, items), default=0))
        else:
            stack.extend(items)
        if total > cap:
            break
    return total


# -- a CEL parser: just enough of the grammar to see the structure ----------------------

_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>[rRbB]{0,2}(?:'''(?:.|\n)*?'''|\"\"\"(?:.|\n)*?\"\"\"|'(?:\\.|[^'\\\n])*'
                        |"(?:\\.|[^"\\\n])*"))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
""", re.X)

Node = tuple[Any, ...]  # ("var", name) ("lit", size) ("sel", x, f) ("idx", x, i)
# ("call", name, target | None, args) ("op", op, args) ("list", items) ("cond", c, a, b)


class _Parser:
    def __init__(self, source: str) -> None:
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(source):
            m = _TOKEN_RE.match(source, pos)
            if m is None:
                raise ValueError(f"cannot tokenise at {pos}")
            pos = m.end()
            kind = m.lastgroup or ""
            if kind != "ws":
                self.toks.append((kind, m.group(0)))
        self.toks.append(("end", ""))
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i][1] if self.toks[self.i][0] == "op" else \
            (self.toks[self.i][1] if self.toks[self.i][1] == "in" else "")

    def take(self, op: str) -> None:
        if self.toks[self.i][1] != op:
            raise ValueError(f"expected {op!r}")
        self.i += 1

    def expr(self) -> Node:
        c = self.binary(0)
        if self.peek() == "?":
            self.i += 1
            a = self.expr()
            self.take(":")
            b = self.expr()
            return ("cond", c, a, b)
        return c

    _LEVELS = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"),
               ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in self._LEVELS[level]:
            op = self.peek()
            self.i += 1
            left = ("op", op, [left, self.binary(level + 1)])
        return left

    def unary(self) -> Node:
        if self.peek() in ("!", "-"):
            op = self.peek()
            self.i += 1
            return ("op", "u" + op, [self.unary()])
        return self.member(self.primary())

    def args(self, close: str) -> list[Node]:
        out: list[Node] = []
        while self.toks[self.i][1] != close:
            out.append(self.expr())
            if self.toks[self.i][1] == ",":
                self.i += 1
            elif self.toks[self.i][1] != close:
                raise ValueError("expected , or " + close)
        self.i += 1
        return out

    def member(self, x: Node) -> Node:
        while True:
            t = self.toks[self.i][1]
            if t == ".":
                self.i += 1
                kind, name = self.toks[self.i]
                if kind != "ident":
                    raise ValueError("expected a field name")
                self.i += 1
                if self.toks[self.i][1] == "(":
                    self.i += 1
                    x = ("call", name, x, self.args(")"))
                else:
                    x = ("sel", x, name)
            elif t == "[":
                self.i += 1
                index = self.expr()
                self.take("]")
                x = ("idx", x, index)
            elif t == "{" and x[0] in ("var", "sel"):  # a message: Type{field: value}
                self.i += 1
                x = ("list", self.fields())
            else:
                return x

    def fields(self) -> list[Node]:
        out: list[Node] = []
        while self.toks[self.i][1] != "}":
            if self.toks[self.i][0] == "ident":  # a message field name
                self.i += 1
            else:
                out.append(self.expr())
            self.take(":")
            out.append(self.expr())
            if self.toks[self.i][1] == ",":
                self.i += 1
        self.i += 1
        return out

    def primary(self) -> Node:
        kind, text = self.toks[self.i]
        self.i += 1
        if kind == "ident":
            if text in ("true", "false", "null"):
                return ("lit", W_SCALAR)
            if self.toks[self.i][1] == "(":
                self.i += 1
                return ("call", text, None, self.args(")"))
            return ("var", text)
        if kind == "num":
            return ("lit", W_SCALAR)
        if kind == "str":
            return ("lit", W_STR + len(text) // CHARS_PER_UNIT, len(text))
        if text == "(":
            x = self.expr()
            self.take(")")
            return x
        if text == "[":
            return ("list", self.args("]"))
        if text == "{":
            return ("list", self.fields())
        if text == ".":  # a leading dot: .name (the root scope)
            return self.primary()
        raise ValueError(f"unexpected {text!r}")


def parse(source: str) -> Node:
    p = _Parser(source)
    tree = p.expr()
    if p.toks[p.i][0] != "end":
        raise ValueError("trailing input")
    return tree


# -- the estimate ---------------------------------------------------------------------


class CostModel:
    """The cost bound of one expression, as a function of the sizes of what it reads."""

    __slots__ = ("paths", "tree")

    def __init__(self, source: str) -> None:
        try:
            self.tree: Node | None = parse(source)
        except (ValueError, IndexError, RecursionError):
            self.tree = None  # not understood: costed as the worst its source allows
        # the dotted paths (``a.b.c``) the tree reads: each is measured on its own, so a
        # macro over ``cfg.items`` iterates over what that list holds, not over ``cfg``
        self.paths: list[tuple[str, ...]] = []
        if self.tree is not None:
            self._paths(self.tree, set())

    def _paths(self, n: Node, bound: set[str]) -> None:
        path = _path_of(n)
        if path is not None and path[0] not in bound and len(path) > 1:
            self.paths.append(path)
        if n[0] == "call" and n[1] in _MACROS and n[2] is not None and n[3] \
                and n[3][0][0] == "var":
            self._paths(n[2], bound)
            inner = bound | {n[3][0][1]}
            for a in n[3][1:]:
                self._paths(a, inner)
            return
        for child in _children(n):
            self._paths(child, bound)

    def estimate(self, context: Mapping[str, object], cap: int) -> tuple[int, dict[str, Size]]:
        """The cost bound over ``context`` (the names read), and the sizes measured.

        Stops early (with a bound over ``cap``) if the values alone cost more."""
        sizes: dict[str, Size] = {}
        spent = 0
        for name, value in context.items():
            s = measure(value, cap - spent)
            sizes[name] = s
            spent += s.cost  # each value is converted once, whatever reads it
            if spent > cap:
                return spent, sizes
        if self.tree is None:
            # an expression this parser does not follow: charged as if it converted
            # everything a hundred times and copied the longest list quadratically --
            # pessimistic on purpose, since nothing is known of what it does
            longest = max((s.length for s in sizes.values()), default=1)
            return spent * 100 + W_APPEND * longest * longest, sizes
        for path in self.paths:
            value = _resolve(context, path)
            if value is not _MISSING:
                sizes[".".join(path)] = measure(value, cap)
        cost, _ = _Walk(sizes).cost(self.tree, {})
        return spent + cost, sizes


_MISSING = object()


def _resolve(context: Mapping[str, object], path: tuple[str, ...]) -> object:
    cur: Any = context
    for part in path:
        if type(cur) is not dict or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _path_of(n: Node) -> tuple[str, ...] | None:
    if n[0] == "var":
        return (n[1],)
    if n[0] == "sel":
        head = _path_of(n[1])
        return None if head is None else (*head, n[2])
    return None


def _children(n: Node) -> list[Node]:
    kind = n[0]
    if kind in ("var", "lit"):
        return []
    if kind == "sel":
        return [n[1]]
    if kind == "idx":
        return [n[1], n[2]]
    if kind == "call":
        return ([n[2]] if n[2] is not None else []) + list(n[3])
    if kind in ("op", "list"):
        return list(n[2] if kind == "op" else n[1])
    return [n[1], n[2], n[3]]  # cond


_STRING_SCANS = frozenset({"contains", "startsWith", "endsWith", "matches", "size",
                           "string", "bytes", "int", "uint", "double", "bool", "dyn",
                           "type", "timestamp", "duration"})


class _Walk:
    """The cost bound of a tree, node by node: each node returns what evaluating it may
    cost (its operands included) and a `Size` bound on its result, for the operators
    above it. ``env`` holds the sizes of the macros' iteration variables in scope."""

    def __init__(self, sizes: dict[str, Size]) -> None:
        self.sizes = sizes

    def cost(self, n: Node, env: dict[str, Size]) -> tuple[int, Size]:
        kind = n[0]
        if kind == "var":
            s = env.get(n[1]) or self.sizes.get(n[1])
            return W_OP, (s if s is not None else SCALAR)
        if kind == "lit":
            return W_OP, Size(n[1], n[2] if len(n) > 2 else 1, 0)
        if kind == "sel":
            return self._select(n, env)
        if kind == "idx":
            # an element of the parent: bounded by its largest element
            c1, parent = self.cost(n[1], env)
            c2, _ = self.cost(n[2], env)
            return c1 + c2 + W_OP, Size(parent.elem, parent.length, parent.elem)
        if kind == "cond":
            c0, _ = self.cost(n[1], env)
            c1, a = self.cost(n[2], env)
            c2, b = self.cost(n[3], env)
            return c0 + c1 + c2, _widest(a, b)  # both branches charged: either may run
        if kind == "list":
            return self._list(n, env)
        if kind == "op":
            return self._op(n, env)
        return self._call(n, env)

    def _select(self, n: Node, env: dict[str, Size]) -> tuple[int, Size]:
        # ``a.b.c`` read from the context was measured on its own (`CostModel.paths`):
        # its own size, far tighter than its root's; else a field of the parent
        path = _path_of(n)
        if path is not None and path[0] not in env:
            s = self.sizes.get(".".join(path))
            if s is not None:
                return W_OP, s
        c, parent = self.cost(n[1], env)
        return c + W_OP, Size(parent.elem, parent.length, parent.elem)

    def _list(self, n: Node, env: dict[str, Size]) -> tuple[int, Size]:
        # a list or map literal: its items evaluated, then converted into one value
        total = W_CONTAINER
        cost = 0
        longest = len(n[1])
        elem = 0
        for item in n[1]:
            c, s = self.cost(item, env)
            cost += c
            total += s.cost
            longest = max(longest, s.length)
            elem = max(elem, s.cost)
        return cost + total, Size(total, longest, elem)

    def _op(self, n: Node, env: dict[str, Size]) -> tuple[int, Size]:
        op, args = n[1], n[2]
        parts = [self.cost(a, env) for a in args]
        cost = sum(c for c, _ in parts)
        sizes = [s for _, s in parts]
        if op == "+":  # a concatenation copies both operands
            a, b = sizes
            out = Size(a.cost + b.cost, a.length + b.length, max(a.elem, b.elem))
            return cost + out.cost, out
        if op in ("==", "!=", "<", "<=", ">", ">=", "in"):  # may scan both operands
            return cost + sizes[0].cost + sizes[1].cost, SCALAR
        return cost + W_OP, SCALAR

    def _call(self, n: Node, env: dict[str, Size]) -> tuple[int, Size]:
        name, target, args = n[1], n[2], n[3]
        if name in _MACROS and target is not None and args and args[0][0] == "var" \
                and len(args) in (2, 3):
            return self._macro(name, target, args, env)
        parts = [self.cost(a, env) for a in ([target] if target is not None else []) + args]
        cost = sum(c for c, _ in parts)
        sizes = [s for _, s in parts]
        if name == "size" or name == "has":
            return cost + W_OP, SCALAR
        if name == "matches" and len(sizes) == 2:
            return cost + 3 * sizes[0].cost + W_REGEX * sizes[1].cost, SCALAR
        scanned = sum(s.cost for s in sizes)
        if name in _STRING_SCANS:
            return cost + scanned, _widest(*sizes) if sizes else SCALAR
        # anything else (string extensions, user functions): may build from all its args
        out = Size(scanned, max((s.length for s in sizes), default=1) * max(1, len(sizes)),
                   scanned)
        return cost + 2 * scanned, out

    def _macro(self, name: str, target: Node, args: list[Node],
               env: dict[str, Size]) -> tuple[int, Size]:
        # ``target.all(x, body)`` and its kin: the body runs once per element of the
        # range (at most its longest length), ``x`` bound to the range's largest element
        c_range, r = self.cost(target, env)
        count = r.length
        var = Size(r.elem, r.length, r.elem)
        inner = {**env, args[0][1]: var}
        body = [self.cost(a, inner) for a in args[1:]]
        per = W_ITER + sum(c for c, _ in body)
        cost = c_range + count * per
        if name in ("map", "filter"):
            # the accumulated list is copied, element by element, at every append
            each = body[-1][1] if name == "map" else var
            cost += count * count * (W_APPEND + each.cost // 4)
            if name == "map":
                total = W_CONTAINER + count * each.cost
                return cost + total, Size(total, max(count, each.length), each.cost)
            return cost, r
        return cost, SCALAR


def _widest(*sizes: Size) -> Size:
    return Size(max(s.cost for s in sizes), max(s.length for s in sizes),
                max(s.elem for s in sizes))
