"""An edge of the definition: one entry of ``edges:``, in all its forms.

A plain edge (``to``, with ``when``/``otherwise``), a switch (``switch`` + ``cases``), a
router, a choose, a map (``map`` + ``as``/``collect``) and an error edge (``on_error``).
`EdgeSpec` checks that an entry is one form and only carries that form's keys; whether the
nodes it names exist is the static checks' business (`_checks_edges`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from ._values import NAME_RE, Count, NameList, Strict, as_list

EdgeKind = Literal["plain", "switch", "router", "choose", "map"]
MAP_CONCURRENCY = 16  # a map edge's max_concurrency when it declares none
MAP_MAX_ITEMS = 10_000  # and its max_items


class EdgeSpec(Strict):
    """One entry of ``edges:``: ``from``/``to`` (a name or a list), with ``when``,
    ``otherwise``, ``map``, ``on_error`` or a router."""

    source: NameList = Field(alias="from")
    to: NameList | None = None
    when: str | None = None
    otherwise: bool = False
    switch: str | None = None
    cases: dict[str, str] | None = None
    default: str | None = None
    router: str | None = None
    choose: NameList | None = None
    max: Count | None = Field(default=None, ge=1)
    # a map edge: ``map`` is a CEL expression giving a list; ``to`` runs once
    # per item, the item under ``as`` in the state it receives
    map: str | None = None
    as_: str | None = Field(default=None, alias="as")
    collect: str | None = None
    max_concurrency: Count | None = Field(default=None, ge=1)
    max_items: Count | None = Field(default=None, ge=0)

    # an error edge: taken when the source fails (after its retries) with an error whose
    # class (or a base class) is listed; ``true`` catches any error of the node's own
    on_error: Annotated[bool | list[str], BeforeValidator(as_list)] = False

    @field_validator("on_error")
    @classmethod
    def _error_names(cls, value: bool | list[str]) -> bool | list[str]:
        if isinstance(value, list):
            if not value:
                raise ValueError("on_error lists exception class names (e.g. [NameError, "
                                 "SyntaxError]); write 'on_error: true' to catch any error")
            for name in value:
                if not NAME_RE.match(name):
                    raise ValueError(f"on_error: {name!r} is not an exception class name "
                                     "(an identifier such as ValueError, matched along the "
                                     "exception's class hierarchy)")
        return value

    @property
    def catches(self) -> tuple[str, ...] | None:
        """An error edge's class names (``()``: any error); None for any other edge."""
        if self.on_error is False:
            return None
        return () if self.on_error is True else tuple(self.on_error)

    @model_validator(mode="after")
    def _error_form(self) -> EdgeSpec:
        if self.on_error is False:
            return self
        extra = [k for k in ("when", "switch", "router", "choose", "cases", "default", "map")
                 if getattr(self, k) is not None] + (["otherwise"] if self.otherwise else [])
        if extra:
            raise ValueError(f"an on_error edge is taken when its source fails; it cannot "
                             f"also have {', '.join(extra)} (route on the error in its "
                             "target's edges instead, e.g. when: 'error.type == \"NameError\"')")
        if len(self.source) > 1:
            raise ValueError("an on_error edge has one source node (the node whose failure "
                             "it catches)")
        return self

    @field_validator("cases", mode="before")
    @classmethod
    def _case_keys(cls, value: object) -> object:
        # YAML keys may be ints or booleans (``1: a``, ``true: b``); CEL values are
        # matched by their canonical text (see case_key), so keys are kept as text.
        if isinstance(value, dict):
            return {case_key(k): v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _one_form(self) -> EdgeSpec:
        if not self.source:
            raise ValueError("'from' must name at least one node")
        forms = [k for k in ("switch", "router", "choose", "map")
                 if getattr(self, k) is not None]
        if len(forms) > 1:
            raise ValueError(f"an edge takes one of switch, router, choose (found {forms})")
        form = forms[0] if forms else "plain"
        if form == "plain" and not self.to:
            raise ValueError("an edge needs 'to' (or one of switch/router/choose)")
        if form in ("switch", "choose") and self.to is not None:
            raise ValueError(f"a {form} edge lists its targets itself; remove 'to'")
        if form == "router" and not self.to:
            raise ValueError("a router edge must declare its possible targets in 'to'")
        if form == "switch" and not self.cases:
            raise ValueError("a switch edge needs 'cases: {value: node}'")
        if form != "switch" and (self.cases is not None or self.default is not None):
            raise ValueError("'cases' and 'default' belong to a switch edge")
        if form != "plain" and (self.when is not None or self.otherwise):
            raise ValueError(f"'when'/'otherwise' cannot be combined with {form}")
        if self.when is not None and self.otherwise:
            raise ValueError("an edge is either 'when' or 'otherwise', not both")
        if form == "choose" and not self.choose:
            raise ValueError("'choose' must list at least one target")
        if form != "plain" and len(self.source) > 1:
            raise ValueError(f"a {form} edge has one source node")
        if form == "map" and (self.to is None or len(self.to) != 1):
            raise ValueError("a map edge runs one node per item: 'to' names exactly one node")
        if form != "map":
            extra = [k for k in ("as", "collect", "max_concurrency", "max_items")
                     if getattr(self, "as_" if k == "as" else k) is not None]
            if extra:
                raise ValueError(f"{', '.join(map(repr, extra))} belong to a map edge "
                                 "({from: a, map: 'a.items', to: b, ...})")
        return self

    @property
    def kind(self) -> EdgeKind:
        if self.switch is not None:
            return "switch"
        if self.router is not None:
            return "router"
        if self.choose is not None:
            return "choose"
        if self.map is not None:
            return "map"
        return "plain"

    @property
    def targets(self) -> list[str]:
        """Every node this edge may deliver to, in declaration order, without repeats."""
        if self.kind == "switch":
            assert self.cases is not None
            out = list(self.cases.values())
            if self.default is not None:
                out.append(self.default)
        elif self.kind == "choose":
            assert self.choose is not None
            out = list(self.choose)
        else:
            assert self.to is not None
            out = list(self.to)
        return list(dict.fromkeys(out))

    @property
    def is_join(self) -> bool:
        return len(self.source) > 1

    @property
    def item_name(self) -> str:
        """A map edge's ``as``: the name of the item in the state of its visit."""
        return self.as_ or "item"

    def describe(self) -> str:
        """A short human name: 'a -> b', '[a, b] -> c', 'risk switch risk.level'."""
        src = self.source[0] if len(self.source) == 1 else "[" + ", ".join(self.source) + "]"
        if self.kind == "switch":
            return f"{src} switch {self.switch!r}"
        if self.kind == "router":
            return f"{src} router {self.router}"
        if self.kind == "map":
            return f"{src} map {self.map!r} -> {self.targets[0]}"
        tgt = self.targets
        dst = tgt[0] if len(tgt) == 1 else "[" + ", ".join(tgt) + "]"
        if self.on_error is not False:
            return f"{src} -> {dst} (on error)"
        return f"{src} -> {dst}"


def case_key(value: object) -> str:
    """The canonical text of a switch value: how a CEL result is matched to ``cases``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
