"""Model providers: the OpenAI Chat Completions API (any OpenAI-compatible server) and a
scripted test double. Both turn a `ChatRequest` into a `Reply` -- plain data, so that a
reply can be journaled in the run's log and replayed instead of paid for twice.

The OpenAI SDK is imported on first use only: ``import interlock`` stays fast.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._errors import (
    AgentConfigError,
    AgentEnvironmentError,
    ProviderConnectionError,
    ProviderError,
    ProviderServerError,
    ProviderStatusError,
    ProviderTimeoutError,
    RateLimitError,
)
from ._spec import ScriptedReply


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(slots=True)
class Reply:
    """What the model said: text (or JSON text), tool calls, and the usage it reported."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None

    @property
    def tokens(self) -> int:
        total = self.usage.get("total_tokens")
        if total is None:
            total = self.usage.get("prompt_tokens", 0) + self.usage.get("completion_tokens", 0)
        return int(total)

    def to_json(self) -> dict[str, Any]:
        return {"content": self.content, "model": self.model, "usage": self.usage,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                               for c in self.tool_calls]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reply:
        return cls(content=data.get("content"), model=data.get("model"),
                   usage=dict(data.get("usage") or {}),
                   tool_calls=[ToolCall(str(c["id"]), str(c["name"]), str(c["arguments"]))
                               for c in data.get("tool_calls") or []])


@dataclass(slots=True)
class ChatRequest:
    """One Chat Completions request. ``index`` is the number of model calls this node
    already made in this run (what a scripted provider replies by)."""

    node: str
    model: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    temperature: float | None = None
    index: int = 0
    item: int | None = None  # a mapped node's item (its index), whose call this is
    item_call: int = 0  # and the calls that item made before this one
    # the reply's text as it arrives, a piece at a time: asks the provider to stream
    on_delta: Callable[[str], None] | None = None


#: where a model's reply goes as it streams: ``sink({"run_id", "node", "turn",
#: "text"})``, set by whoever shows it live (``interlock chat``, a server's event stream)
#: in the context that executes the run; None: nothing streams
TOKEN_SINK: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar(
    "interlock_token_sink", default=None)


class Provider(Protocol):
    async def complete(self, request: ChatRequest) -> Reply: ...


class RepliesExhausted(AgentConfigError):
    """A scripted provider was asked for more replies than it declares."""


class ScriptedProvider:
    """A provider that replays declared replies, one per model call, in order.

    Each reply is a mapping: ``content`` (a string, or JSON data sent as JSON text),
    optional ``tool_calls: [{name, arguments, id}]`` and optional ``usage:
    {prompt_tokens, completion_tokens, total_tokens}``; a bare string is short for
    ``{"content": ...}``. Every run starts from the first reply; a call that a run
    replays from its log (a retry, a resume) does not consume one. Pass it as
    ``Workflow.agent(..., provider=ScriptedProvider([...]))``; in a file, write
    ``provider: scripted`` and ``replies: [...]``. No network, no key, deterministic.
    Asked to stream (a conversation's reply, ``on_delta``), it hands the content over a
    word at a time, as a streaming model would.
    """

    def __init__(self, replies: Iterable[Mapping[str, Any] | str | list[Any]]) -> None:
        self.replies: list[dict[str, Any] | list[dict[str, Any]]] = [
            [_reply_data(x) for x in r] if isinstance(r, list) else _reply_data(r)
            for r in replies]

    def __repr__(self) -> str:
        return f"ScriptedProvider({len(self.replies)} replies)"

    async def complete(self, request: ChatRequest) -> Reply:
        k = request.item_call
        if request.item is not None and k < len(self.replies) \
                and isinstance(self.replies[k], list):
            # one reply per item of a mapped node: the k-th call of item i gets entry i of
            # the k-th reply, whatever order the items run in
            entry = self.replies[k]
        elif request.index >= len(self.replies):
            raise RepliesExhausted(
                f"the scripted provider of node {request.node!r} has no reply left: it "
                f"declares {len(self.replies)} and this is model call {request.index + 1} "
                "of the run; add replies")
        else:
            entry = self.replies[request.index]
        if isinstance(entry, list):
            if request.item is None or not 0 <= request.item < len(entry):
                what = "is not a mapped node's item" if request.item is None \
                    else f"is item {request.item}"
                raise RepliesExhausted(
                    f"the scripted provider of node {request.node!r}: its reply is a list "
                    f"of {len(entry)} (one per item of a mapped node), and this call "
                    f"{what}; give one entry per item")
            entry = entry[request.item]
        r = ScriptedReply.model_validate(entry)
        content = r.content
        if content is not None and not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        calls = [ToolCall(c.id or f"call_{request.index}_{i}", c.name,
                          c.arguments if isinstance(c.arguments, str)
                          else json.dumps(c.arguments, ensure_ascii=False))
                 for i, c in enumerate(r.tool_calls)]
        if request.on_delta is not None and content:  # streamed: a word at a time
            for word in re.findall(r"\S+\s*|\s+", content):
                request.on_delta(word)
        usage: dict[str, int] = {}
        if r.usage is not None:
            usage = {"prompt_tokens": r.usage.prompt_tokens,
                     "completion_tokens": r.usage.completion_tokens,
                     "total_tokens": r.usage.total_tokens if r.usage.total_tokens is not None
                     else r.usage.prompt_tokens + r.usage.completion_tokens}
        return Reply(content, calls, usage, request.model or "scripted")


def _reply_data(r: Mapping[str, Any] | str) -> dict[str, Any]:
    return ScriptedReply.model_validate(r).model_dump(mode="json", exclude_defaults=True)


class OpenAIProvider:
    """Chat Completions through the official OpenAI SDK (``AsyncOpenAI``).

    ``base_url``: the agent's, else ``$OPENAI_BASE_URL``, else OpenAI's. The key:
    ``$<api_key_env>`` when the agent names a variable, else ``$OPENAI_API_KEY`` (a local
    server accepts any non-empty value). The SDK's own retries are off
    (``max_retries=0``): retrying is the node's ``retry:`` policy, and its errors are
    mapped to `ProviderError` subclasses that policy can name.
    """

    def __init__(self, base_url: str | None = None, api_key_env: str | None = None,
                 timeout: float | None = None) -> None:
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout = timeout

    def _key(self, node: str) -> str:
        var = self.api_key_env or "OPENAI_API_KEY"
        key = os.environ.get(var)
        if not key:
            raise AgentEnvironmentError(
                f"agent node {node!r}: no API key: set ${var}"
                + ("" if self.api_key_env else " (or name another variable with api_key_env)")
                + " -- a local OpenAI-compatible server accepts any non-empty value")
        return key

    async def complete(self, request: ChatRequest) -> Reply:
        import openai

        kwargs: dict[str, Any] = {"model": request.model, "messages": request.messages}
        if request.tools:
            kwargs["tools"] = request.tools
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        options: dict[str, Any] = {"api_key": self._key(request.node), "max_retries": 0,
                                   "base_url": self.base_url or os.environ.get("OPENAI_BASE_URL")
                                   or None}
        if self.timeout is not None:
            options["timeout"] = self.timeout
        try:
            async with openai.AsyncOpenAI(**options) as client:
                if request.on_delta is not None:
                    return await _streamed(client, kwargs, request.on_delta)
                try:
                    resp = await client.chat.completions.create(**kwargs)
                except openai.BadRequestError as exc:
                    # request response_format "where the server supports it". A
                    # server that refuses it gets the call again without it; the schema is
                    # in the system prompt too, and the reply is validated either way.
                    if "response_format" not in kwargs or not _about_format(exc):
                        raise
                    del kwargs["response_format"]
                    resp = await client.chat.completions.create(**kwargs)
        except openai.RateLimitError as exc:
            raise RateLimitError(_describe(exc, "rate limited"), status=429) from exc
        except openai.APITimeoutError as exc:
            raise ProviderTimeoutError(f"the provider did not answer in time: {exc}") from exc
        except openai.APIConnectionError as exc:
            url = options["base_url"] or "OpenAI's API (no base_url, no $OPENAI_BASE_URL)"
            raise ProviderConnectionError(f"cannot reach the provider at {url}: {exc}") from exc
        except openai.APIStatusError as exc:
            cls = ProviderServerError if exc.status_code >= 500 else ProviderStatusError
            raise cls(_describe(exc, "refused the call"), status=exc.status_code) from exc
        except openai.APIError as exc:
            raise ProviderError(f"the provider's reply is not usable: {exc}") from exc
        return _reply_of(resp)


async def _streamed(client: Any, kwargs: dict[str, Any], on_delta: Callable[[str], None]
                   ) -> Reply:
    """A streamed completion (``stream: true``): each piece of the content handed to
    ``on_delta`` as it arrives, the tool calls assembled from their pieces, the usage
    from the last chunk (``stream_options.include_usage``)."""
    stream = await client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True})
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: dict[str, int] = {}
    model = None
    async for chunk in stream:
        model = getattr(chunk, "model", None) or model
        u = getattr(chunk, "usage", None)
        if u is not None:
            usage = {"prompt_tokens": int(u.prompt_tokens or 0),
                     "completion_tokens": int(u.completion_tokens or 0),
                     "total_tokens": int(u.total_tokens or 0)}
        for choice in getattr(chunk, "choices", None) or ():
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                text.append(delta.content)
                on_delta(delta.content)
            for tc in delta.tool_calls or ():
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    call["id"] = tc.id
                fn = tc.function
                if fn is not None:
                    call["name"] += fn.name or ""
                    call["arguments"] += fn.arguments or ""
    tool_calls = [ToolCall(str(c["id"] or f"call_{i}"), c["name"], c["arguments"] or "{}")
                  for i, c in sorted(calls.items())]
    return Reply("".join(text) if text else None, tool_calls, usage, model)


def _about_format(exc: Any) -> bool:
    text = str(getattr(exc, "message", exc)).lower()
    return any(w in text for w in ("response_format", "json_schema", "structured output"))


def _describe(exc: Any, what: str) -> str:
    status = getattr(exc, "status_code", None)
    return f"the provider {what} (HTTP {status}): {getattr(exc, 'message', exc)}"


def _reply_of(resp: Any) -> Reply:
    if not getattr(resp, "choices", None):
        raise ProviderError("the provider's reply has no choices")
    msg = resp.choices[0].message
    calls = []
    for tc in getattr(msg, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        if fn is None:
            raise ProviderError(f"the model made a tool call of type {tc.type!r}; only "
                                "function tools are supported")
        calls.append(ToolCall(str(tc.id), str(fn.name), str(fn.arguments or "{}")))
    usage: dict[str, int] = {}
    u = getattr(resp, "usage", None)
    if u is not None:
        usage = {"prompt_tokens": int(u.prompt_tokens or 0),
                 "completion_tokens": int(u.completion_tokens or 0),
                 "total_tokens": int(u.total_tokens or 0)}
    return Reply(msg.content, calls, usage, getattr(resp, "model", None))
