"""Prompt templates: Jinja2, rendered in its sandbox over the node's ``reads``.

A name the template uses that the state does not have is an error (StrictUndefined),
not an empty string; ``{{ x | default('') }}`` makes a field optional. Mappings and
lists render as JSON (``{{ plan }}``), and ``| json`` does so explicitly.

The sandbox stops escapes, not cost, so rendering is bounded too:

- size: ``**``, ``*`` and ``+`` are checked before they compute (a result longer than
  INTERLOCK_MAX_PROMPT_CHARS characters, or a number with more digits, is refused) and
  the output is counted as it is generated;
- time: `render_in_thread` renders in a worker thread (the event loop stays free, so the
  node's ``timeout`` and a cancel can fire) under a trace function that stops the
  template once INTERLOCK_MAX_RENDER_MS has passed or the node was stopped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from .._definition._limits import RENDER_CHARS, RENDER_MS
from ._errors import AgentConfigError

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.sandbox import SandboxedEnvironment


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _finalize(value: Any) -> Any:
    return _json(value) if isinstance(value, dict | list) else value


class RenderLimitError(AgentConfigError):
    """A prompt template went past INTERLOCK_MAX_PROMPT_CHARS or INTERLOCK_MAX_RENDER_MS."""


def _too_long(what: str, n: float, limit: int) -> RenderLimitError:
    return RenderLimitError(
        f"{what} would be about {n:_.0f} characters long, over the limit of {limit:_} "
        f"({RENDER_CHARS.env} raises it)")


def _length(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _digits(value: int) -> float:
    return value.bit_length() * 0.30103 + 1


def _call_binop(left: Any, op: str, right: Any, limit: int) -> None:
    """Refuse ``left op right`` if its result would be longer than ``limit``."""
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "**" and ints and right > 0 and abs(left) > 1:
        n = right * math.log10(abs(left))
        if n > limit:
            raise _too_long(f"the number {left} ** {right}", n, limit)
    elif op == "*":
        if ints:
            n = _digits(left) + _digits(right)
        else:
            lengths = [_length(left), _length(right)]
            counts = [v for v in (left, right) if isinstance(v, int)]
            n = (max(x for x in lengths if x is not None) * abs(counts[0])
                 if counts and any(x is not None for x in lengths) else 0)
        if n > limit:
            raise _too_long(f"a {type(left).__name__} * {type(right).__name__}", n, limit)
    elif op == "+":
        a, b = _length(left), _length(right)
        if a is not None and b is not None and a + b > limit:
            raise _too_long(f"a {type(left).__name__} + {type(right).__name__}", a + b, limit)


@functools.cache
def environment() -> SandboxedEnvironment:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    class Bounded(SandboxedEnvironment):
        intercepted_binops = frozenset({"**", "*", "+"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _call_binop(left, operator, right, RENDER_CHARS.get())
            return super().call_binop(context, operator, left, right)

    env = Bounded(undefined=StrictUndefined, autoescape=False,
                  keep_trailing_newline=True, finalize=_finalize)
    env.filters["json"] = _json
    return env


def compile_template(source: str) -> Template:
    """Raises jinja2.TemplateSyntaxError."""
    return environment().from_string(source)


def variables(source: str) -> set[str]:
    """The top-level names a template reads. Raises jinja2.TemplateSyntaxError."""
    from jinja2 import meta

    env = environment()
    return set(meta.find_undeclared_variables(env.parse(source)))


def render(template: Template, scope: Mapping[str, Any]) -> str:
    """Render, refusing an output longer than INTERLOCK_MAX_PROMPT_CHARS."""
    limit = RENDER_CHARS.get()
    parts: list[str] = []
    n = 0
    for chunk in template.generate(dict(scope)):
        n += len(chunk)
        if n > limit:
            raise RenderLimitError(
                f"the rendered prompt passed {limit:_} characters, the limit "
                f"({RENDER_CHARS.env} raises it)")
        parts.append(chunk)
    return "".join(parts)


T = TypeVar("T")
_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="interlock-render")


class _Stopped(RenderLimitError):
    pass


async def render_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread, stopped after INTERLOCK_MAX_RENDER_MS or when the
    awaiting task is cancelled (the node's timeout, a cancel): a trace function in the
    thread checks the deadline on every line the template's code runs."""
    limit_ms = RENDER_MS.get()
    deadline = time.monotonic() + limit_ms / 1000
    stop = threading.Event()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if stop.is_set():
            raise _Stopped("the node was stopped while its prompt rendered")
        if time.monotonic() > deadline:
            raise RenderLimitError(
                f"the prompt took longer than {limit_ms:_} ms to render, the limit "
                f"({RENDER_MS.env} raises it)")
        # lines are traced in the template's own code (its loops); other calls only enter
        return tracer if event != "call" or frame.f_code.co_filename == "<template>" \
            else None

    def call() -> T:
        sys.settrace(tracer)
        try:
            return fn(*args)
        finally:
            sys.settrace(None)

    future = asyncio.get_running_loop().run_in_executor(_THREADS, call)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
    try:
        return await asyncio.shield(future)
    finally:
        stop.set()  # a timeout or a cancel: the thread stops at its next line
