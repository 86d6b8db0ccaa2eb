"""The on-call assistant's Python tools (assistant.yaml): offline stand-ins that read the
bundled scenarios, so the demo needs no cluster."""

from __future__ import annotations

from .nodes import SCENARIOS


def service_status(service: str, scenario: str = "broker-down") -> dict[str, str]:
    """The current status of one service (kafka, kubernetes, observability, elasticsearch,
    docker) in a scenario."""
    problem = SCENARIOS.get(scenario, {}).get(service)
    return {"service": service, "status": "degraded" if problem else "healthy",
            "detail": problem or "no findings"}


def restart_service(service: str) -> str:
    """Restart a service (guarded: a person confirms each call). The demo's restarts
    nothing: its call is in the run's log (tool.called)."""
    return f"{service} restarted"


def kafka_lag(topic: str) -> dict[str, object]:
    """Consumer lag of a Kafka topic, in messages."""
    return {"topic": topic, "lag": 12_000, "stuck_consumer": "payments-3"}


def pod_events(namespace: str) -> list[str]:
    """Recent Kubernetes events of a namespace."""
    return [f"{namespace}: 3 pods evicted (DiskPressure)"]
