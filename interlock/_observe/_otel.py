"""OpenTelemetry spans of a run, made from its records.

A run is its log, so its trace is too: `RunSpans` is a listener of the run's journal
(it sees each record as it is sealed) and turns records into spans --

- one span per execution of the run (``interlock.run <workflow>``): from ``run.started``
  (or ``run.resumed``, ``run.forked``) to the record that ends or pauses it; a resumed
  run's span links to the span that started the run (its ids are in ``run.started``);
- one span per node attempt (``interlock.node <node>``), a child of the run's: from
  ``node.started`` to ``node.completed``, ``node.failed`` or ``node.retrying`` (a
  ``node.visited``: its duration, up to its time); a mapped
  node's visit is a span and each item's attempt a child of it;
- one span per model call of an agent node (``chat <model>``, a child of the node's),
  with the GenAI semantic-convention attributes (``gen_ai.system``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens``), which the
  node's span sums;
- edge decisions as events of the run's span (``edge.taken``/``edge.skipped``: those
  that evaluated something -- a condition, a switch, a router, ``max`` -- not the
  unconditional edges).

Times are the records' ``at``. Tracing is on when the application configured a tracer
provider (``opentelemetry.trace.set_tracer_provider``), or when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set, in which case
interlock exports over OTLP/HTTP with a provider of its own. Otherwise nothing is
imported and a run pays nothing: `run_spans` returns None.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import _log as L

if TYPE_CHECKING:  # (the ``otel`` extra: imported at run time only when tracing is on)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

V = TypeVar("V")  # what the journal hands a listener with each record (its RunView)
Listener = Callable[[L.Record, V], None]

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# interlock's OTLP provider, made on first use when configured
_own_provider: TracerProvider | None = None


def _tracer() -> Tracer | None:
    """The tracer runs report to, or None when tracing is off (see the module's text)."""
    endpoint = any(os.environ.get(v) for v in _ENDPOINT_VARS)
    if "opentelemetry.trace" not in sys.modules and not endpoint:
        return None  # nobody set a provider up: no import, no cost
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        if not endpoint:
            return None
        own = _otlp_provider()
        if own is None:
            return None
        return own.get_tracer("interlock", _version())
    return provider.get_tracer("interlock", _version())


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("interlock")
    except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
        return "0"


def _otlp_provider() -> TracerProvider | None:
    global _own_provider
    if _own_provider is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:  # the API alone (another library's): nothing to export with
            return None
        provider = TracerProvider(resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "interlock")}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _own_provider = provider
    return _own_provider


def tracing() -> bool:
    """Whether runs are traced (see the module's text); cheap when they are not."""
    return _tracer() is not None


def run_spans(run_id: str, workflow: str, *, continues: Mapping[str, str] | None = None
              ) -> RunSpans | None:
    """The spans of one execution of a run, started now; None when tracing is off.
    ``continues``: the ``trace`` ids of the run's ``run.started`` (a resume or a fork
    links to them)."""
    tracer = _tracer()
    if tracer is None:
        return None
    return RunSpans(tracer, run_id, workflow, continues)


def with_spans(listener: Listener[V] | None, spans: RunSpans | None) -> Listener[V] | None:
    """The journal's listener: the caller's, then the spans'."""
    if spans is None:
        return listener
    if listener is None:
        return spans

    return _Both(listener, spans)


class _Both(Generic[V]):
    """The caller's listener, then the spans'; a child run gets the caller's child
    listener (`_execute.child_listener`), its spans being its own."""

    __slots__ = ("child", "listener", "spans")

    def __init__(self, listener: Listener[V], spans: RunSpans) -> None:
        self.listener, self.spans = listener, spans
        self.child = getattr(listener, "child", None)

    def __call__(self, rec: L.Record, view: V) -> None:
        self.listener(rec, view)
        self.spans(rec, view)


def _ns(rec: L.Record) -> int:
    return int(float(rec["at"]) * 1e9)


_RUN_ENDS = {L.RUN_COMPLETED: "COMPLETED", L.RUN_FAILED: "FAILED", L.RUN_REJECTED: "REJECTED",
             L.RUN_CANCELLED: "CANCELLED", L.RUN_WAITING: "WAITING_APPROVAL"}


class RunSpans:
    """The listener that makes a run's spans from its records (see the module's text)."""

    def __init__(self, tracer: Tracer, run_id: str, workflow: str,
                 continues: Mapping[str, str] | None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = tracer
        self.run_id = run_id
        self.workflow = workflow
        self.base = {"interlock.workflow": workflow, "interlock.run_id": run_id}
        links = []
        if continues and continues.get("trace_id") and continues.get("span_id"):
            earlier = trace.SpanContext(int(continues["trace_id"], 16),
                                        int(continues["span_id"], 16), is_remote=True,
                                        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
            links.append(trace.Link(earlier, {"interlock.link": "run.started"}))
        run = tracer.start_span(f"interlock.run {workflow}", attributes=self.base,
                                links=links, kind=trace.SpanKind.INTERNAL)
        self.run: Span | None = run  # None once ended
        self._run_context = run.get_span_context()
        self._ctx = trace.set_span_in_context(run)
        self.nodes: dict[tuple[str, int, int | None], Span] = {}
        self.calls: dict[tuple[str, int, int | None], Span] = {}

    @property
    def ids(self) -> dict[str, str]:
        """What ``run.started`` records: the trace and the run span's ids (hex)."""
        sc = self._run_context
        return {"trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}"}

    def __call__(self, rec: L.Record, view: object) -> None:
        if self.run is None:  # ended (the run waits, or ended, or the call returned)
            return
        rtype = rec["type"]
        if rtype == L.NODE_STARTED:
            self._node_started(rec)
        elif rtype in (L.NODE_COMPLETED, L.NODE_FAILED, L.NODE_RETRYING):
            self._node_ended(rec)
        elif rtype == L.NODE_VISITED:  # (log format 2) started and completed: one span
            started = {**rec, "at": rec["at"] - (rec.get("duration_ms") or 0.0) / 1000}
            self._node_started(started)
            self._end_node((rec["node"], rec["visit"], None), rec, "completed")
        elif rtype in (L.EDGE_TAKEN, L.EDGE_SKIPPED):
            # a decision: what was evaluated (an unconditional edge decides nothing, and a
            # 10,000-node chain would otherwise put 10,000 events on one span)
            if rec.get("expr") is not None or rec.get("reason") is not None:
                self.run.add_event(rtype, {
                    "interlock.edge": rec.get("edge"), "interlock.from": rec.get("from", "*"),
                    "interlock.to": list(rec.get("to") or ()),
                    "interlock.expr": str(rec.get("expr")),
                    "interlock.value": L.dumps(rec.get("value")).decode(),
                    "interlock.reason": str(rec.get("reason") or "")}, timestamp=_ns(rec))
        elif rtype == "agent.request":
            self._call_started(rec)
        elif rtype == "agent.reply":
            self._call_ended(rec)
        elif rtype == L.APPROVAL_REQUESTED:
            self.run.add_event(rtype, {"interlock.node": rec["node"],
                                       "interlock.kind": str(rec.get("kind"))},
                               timestamp=_ns(rec))
            if rec.get("kind") in ("tool", "message"):  # paused mid-body: its attempt ends
                self._end_node((rec["node"], rec["visit"], None), rec, "paused")
        elif rtype in _RUN_ENDS:
            status = _RUN_ENDS[rtype]
            if (rec.get("waiting") or {}).get("kind") == "message":  # a conversation
                status = "WAITING_INPUT"
            self.end(rec, status)

    # -- nodes -------------------------------------------------------------------------

    def _node_started(self, rec: L.Record) -> None:
        node, visit, item = rec["node"], rec["visit"], rec.get("item")
        parent = self._ctx
        if item is not None:  # an item of a mapped node: a child of the node's visit
            visit_span = self.nodes.get((node, visit, None))
            if visit_span is not None:
                parent = self._trace.set_span_in_context(visit_span)
        attrs: dict[str, AttributeValue] = {
            **self.base, "interlock.node": node, "interlock.visit": visit,
            "interlock.attempt": rec.get("attempt", 1)}
        if item is not None:
            attrs["interlock.item"] = item
        key = (node, visit, item)
        old = self.nodes.pop(key, None)
        if old is not None:  # (an attempt whose end had no record of its own)
            old.end(end_time=_ns(rec))
        self.nodes[key] = self.tracer.start_span(f"interlock.node {node}", context=parent,
                                                 attributes=attrs, start_time=_ns(rec))

    def _node_ended(self, rec: L.Record) -> None:
        status = {L.NODE_COMPLETED: "completed", L.NODE_FAILED: "failed",
                  L.NODE_RETRYING: "retrying"}[rec["type"]]
        if rec.get("caught"):
            status = "caught"
        error = rec.get("error")
        if isinstance(error, dict) and error.get("type") == "cancelled":
            status = "cancelled"
        self._end_node((rec["node"], rec["visit"], rec.get("item")), rec, status)

    def _end_node(self, key: tuple[str, int, int | None], rec: L.Record, status: str) -> None:
        span = self.nodes.pop(key, None)
        if span is None:
            return
        span.set_attribute("interlock.status", status)
        if rec.get("tokens"):
            span.set_attribute("interlock.tokens", rec["tokens"])
        if rec.get("items") is not None:
            span.set_attribute("interlock.items", rec["items"])
        error = rec.get("error")
        if isinstance(error, dict) and status in ("failed", "retrying", "caught"):
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                               str(error.get("message", ""))[:500]))
            span.set_attribute("error.type", str(error.get("details", {}).get("exception")
                                                 or error.get("type")))
        span.end(end_time=_ns(rec))

    # -- model calls ---------------------------------------------------------------------

    def _call_started(self, rec: L.Record) -> None:
        key = (rec["node"], rec["visit"], rec.get("item"))
        node_span = self.nodes.get(key)
        parent = self._trace.set_span_in_context(node_span) if node_span else self._ctx
        model = str(rec.get("model") or "")
        attrs = {**self.base, "interlock.node": rec["node"], "gen_ai.operation.name": "chat",
                 "gen_ai.system": str(rec.get("provider") or ""),
                 "gen_ai.request.model": model}
        old = self.calls.pop(key, None)
        if old is not None:
            old.end(end_time=_ns(rec))
        self.calls[key] = self.tracer.start_span(f"chat {model}".strip(), context=parent,
                                                 attributes=attrs, start_time=_ns(rec))
        if node_span is not None:
            node_span.set_attribute("gen_ai.system", attrs["gen_ai.system"])
            node_span.set_attribute("gen_ai.request.model", model)

    def _call_ended(self, rec: L.Record) -> None:
        key = (rec["node"], rec["visit"], rec.get("item"))
        span = self.calls.pop(key, None)
        usage = rec.get("usage") or {}
        tokens_in = usage.get("prompt_tokens", usage.get("input_tokens"))
        tokens_out = usage.get("completion_tokens", usage.get("output_tokens"))
        node_span = self.nodes.get(key)
        for target in (span, node_span):
            if target is None:
                continue
            if rec.get("model"):
                target.set_attribute("gen_ai.response.model", str(rec["model"]))
        if span is not None:
            if isinstance(tokens_in, int):
                span.set_attribute("gen_ai.usage.input_tokens", tokens_in)
            if isinstance(tokens_out, int):
                span.set_attribute("gen_ai.usage.output_tokens", tokens_out)
            span.end(end_time=_ns(rec))
        if node_span is not None:  # the node's: the sum of its calls'
            attrs = getattr(node_span, "attributes", None) or {}
            for name, n in (("gen_ai.usage.input_tokens", tokens_in),
                            ("gen_ai.usage.output_tokens", tokens_out)):
                if isinstance(n, int):
                    node_span.set_attribute(name, int(attrs.get(name, 0)) + n)

    # -- the run ---------------------------------------------------------------------------

    def abort(self, exc: BaseException, status: str | None = None) -> None:
        """End every span still open with an error status naming ``exc``: the run was not
        started (``status`` "REFUSED": its id taken, the store refused), not executed (a
        cancel came first) or stopped by an error; idempotent."""
        if self.run is None:
            return
        if status is not None:
            self.run.set_attribute("interlock.status", status)
        self.run.record_exception(exc)
        self.run.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                               f"{type(exc).__name__}: {exc}"[:500]))
        self.end()

    def end(self, rec: L.Record | None = None, status: str | None = None) -> None:
        """End every span still open (at ``rec``'s time), the run's last; idempotent."""
        if self.run is None:
            return
        at = _ns(rec) if rec is not None else None
        for span in [*self.calls.values(), *reversed(self.nodes.values())]:
            span.end(end_time=at)
        self.calls.clear()
        self.nodes.clear()
        if status is not None:
            self.run.set_attribute("interlock.status", status)
            if status == "FAILED" and rec is not None:
                error = rec.get("error") or {}
                self.run.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                                       str(error.get("message", ""))[:500]))
        self.run.end(end_time=at)
        self.run = None


__all__ = ["RunSpans", "run_spans", "tracing", "with_spans"]
