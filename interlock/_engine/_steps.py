"""Awaiting a coroutine one step at a time, in the awaiting task.

`Steps` is what ``await coro`` does (PEP 380: pass what the coroutine waits on up
to the task, and what the task sends or throws back down), plus two things a
plain ``await`` cannot do:

- run every step inside a given ``contextvars.Context`` -- what a task of its
  own would give the coroutine, without the task (the executor, `_runs`);
- carry on from a first step the caller has already taken -- so a node body
  that returns without suspending never needs a timer (`_guards.in_loop`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_NOT_STARTED = object()


def _call(fn: Callable[..., object], *args: object) -> object:
    return fn(*args)


class Steps(Generic[T]):
    """``await Steps(coro)``: the same as ``await coro``, with the options above.

    ``first``: what the coroutine yielded at the first step the caller took itself.
    ``context``: run each step in this context.
    """

    __slots__ = ("_context", "_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, T], *, first: Any = _NOT_STARTED,
                 context: contextvars.Context | None = None) -> None:
        self._coro, self._first, self._context = coro, first, context

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        run = self._context.run if self._context is not None else _call
        try:
            signal = run(coro.send, None) if self._first is _NOT_STARTED else self._first
            while True:
                try:
                    value = yield signal
                except GeneratorExit:
                    run(coro.close)
                    raise
                except BaseException as exc:  # a cancellation, a timeout: into the coroutine
                    signal = run(coro.throw, exc)
                else:
                    signal = run(coro.send, value)
        except StopIteration as stop:
            result: T = stop.value
            return result
