"""Deterministic, offline stand-ins for the incident agents (rule-based, no LLM).

Each node reads declared fields and returns one structured field, the shape an
``agent:`` node would be asked for with an ``output:`` schema, so an LLM agent can
replace any of them without touching the graph:

    intake     error_event                -> incident {id, service, signature, ...}
    retrieval  incident                   -> retrieved_logs [log lines]    ("Splunk": logs.jsonl)
    rag        incident                   -> similar_error_docs [past incidents] (known_errors)
    rca        incident, retrieved_logs,
               similar_error_docs         -> rca {root_cause, severity, confidence, evidence} | null
    recommend  incident, rca              -> recommended_action {title, steps, patch}
    code_fix   incident, recommended_action -> code_fix {pr, path}   (guarded: confirm: true)

Both parallel branches also append to ``events`` (an append reducer), the only
field they share. ``rca`` is null when no rule explains the event (the policy's
"no RCA available" row). The similarity search of ``rag`` is plain token overlap,
standing in for a vector store; examples/audit shows real hybrid retrieval.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import interlock

HERE = Path(__file__).parent
LOG_WINDOW = timedelta(minutes=5)


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9_]+", text.lower()) if len(w) > 2}


# ---- intake ----------------------------------------------------------------------

def intake(state: dict[str, Any]) -> dict[str, Any]:
    event = state["error_event"]
    error_type = event["error"].split(":", 1)[0].strip()
    incident = {
        "id": event["id"],
        "time": event["time"],
        "service": event["service"],
        "signature": f"{error_type} on {event['method']} {event['path']}",
        "error": event["error"],
        "message": event["message"],
        "status": event["status"],
    }
    return {"incident": incident, "events": f"intake: {incident['signature']}"}


# ---- the two parallel branches ---------------------------------------------------

def retrieve_logs(state: dict[str, Any]) -> dict[str, Any]:
    """The service's log lines within five minutes of the event (the bundled log store)."""
    incident = state["incident"]
    at = _time(incident["time"])
    lines = []
    for raw in (HERE / "logs.jsonl").read_text().splitlines():
        line = json.loads(raw)
        if line["service"] == incident["service"] and abs(_time(line["time"]) - at) <= LOG_WINDOW:
            lines.append(line)
    return {"retrieved_logs": lines, "events": f"retrieval: {len(lines)} log line(s)"}


def similar_errors(state: dict[str, Any]) -> dict[str, Any]:
    """Past incidents whose signature shares words with this error (token overlap)."""
    incident = state["incident"]
    query = _words(f"{incident['error']} {incident['message']} {incident['service']}")
    scored = []
    for doc in json.loads((HERE / "known_errors.json").read_text()):
        words = _words(f"{doc['title']} {doc['signature']} {doc['service']}")
        score = len(query & words) / len(query | words)
        if score >= 0.1:
            scored.append({**doc, "similarity": round(score, 3)})
    scored.sort(key=lambda d: (-d["similarity"], d["id"]))
    return {"similar_error_docs": scored[:2],
            "events": f"rag: {len(scored[:2])} similar incident(s)"}


# ---- rca and recommendation ------------------------------------------------------

# pattern on the error -> cause, severity, base confidence; `logs` corroborates it,
# `known` are the past incidents that describe the same cause
RULES: list[dict[str, Any]] = [
    {"name": "missing-tax-rate", "error": r"TypeError.*Decimal.*NoneType",
     "root_cause": "a catalog item without tax_rate reaches pricing.line_tax, "
                   "which multiplies the price by None",
     "severity": "high", "confidence": 0.6, "logs": r"tax_rate=None|without tax_rate",
     "known": ["INC-311"],
     "action": "Default a missing tax_rate to 0 in pricing.line_tax and flag the item",
     "file": "backend/app/pricing.py",
     "patch": ["-    tax = line.price * line.item.tax_rate",
               "+    tax = line.price * (line.item.tax_rate or Decimal(\"0\"))"]},
    {"name": "gateway-timeout", "error": r"ReadTimeout",
     "root_cause": "the card gateway answered slower than the 5 s client timeout "
                   "(a latency spike; pool exhaustion not ruled out)",
     "severity": "high", "confidence": 0.3, "logs": r"latency p95=\d{4,}ms",
     "known": ["INC-295"],
     "action": "Raise the gateway client timeout to 10 s and retry once",
     "file": "payments/gateway.py",
     "patch": ["-GATEWAY_TIMEOUT = 5.0", "+GATEWAY_TIMEOUT = 10.0"]},
    {"name": "missing-asset", "error": r"NotFound: static asset",
     "root_cause": "the receipt template links logo-dark.png, which the build no longer ships",
     "severity": "low", "confidence": 0.7, "logs": r"build manifest lists",
     "known": ["INC-240"],
     "action": "Point the receipt template at logo.png",
     "file": "receipt-web/templates/receipt.html",
     "patch": ["-<img src=\"/static/img/logo-dark.png\">",
               "+<img src=\"/static/img/logo.png\">"]},
]


def rca(state: dict[str, Any]) -> dict[str, Any]:
    incident = state["incident"]
    rule = next((r for r in RULES if re.search(r["error"], incident["error"])), None)
    if rule is None:
        return {"rca": None, "events": "rca: no rule explains the event"}
    evidence = []
    confidence = rule["confidence"]
    corroborating = [ln["msg"] for ln in state["retrieved_logs"]
                     if re.search(rule["logs"], ln["msg"])]
    if corroborating:
        confidence += 0.15
        evidence += [f"log: {m}" for m in corroborating]
    similar = [d["id"] for d in state["similar_error_docs"] if d["id"] in rule["known"]]
    if similar:
        confidence += 0.1
        evidence += [f"past incident: {i}" for i in similar]
    result = {"rule": rule["name"], "root_cause": rule["root_cause"],
              "severity": rule["severity"], "confidence": round(min(confidence, 0.95), 2),
              "evidence": evidence}
    return {"rca": result,
            "events": f"rca: {rule['name']} (confidence {result['confidence']})"}


def recommend(state: dict[str, Any]) -> dict[str, Any]:
    found = state["rca"]
    if found is None:
        return {"recommended_action": {
            "title": "Investigate manually: no known cause matches this error",
            "steps": ["collect a core dump or a reproduction", "open a ticket for the owning team"],
            "patch": None}}
    rule = next(r for r in RULES if r["name"] == found["rule"])
    patch = "\n".join([f"--- a/{rule['file']}", f"+++ b/{rule['file']}", *rule["patch"], ""])
    return {"recommended_action": {
        "title": rule["action"],
        "steps": [f"apply the patch to {rule['file']}", "run the service's tests", "deploy"],
        "patch": patch}}


# ---- the guarded actuator --------------------------------------------------------

def _open_pull_request(fix_dir: str, name: str, body: str) -> dict[str, str]:
    """The side effect: "open a PR" by writing the patch into a local folder."""
    folder = Path(fix_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.patch"
    path.write_text(body)
    return {"pr": "PR-" + hashlib.sha256(body.encode()).hexdigest()[:8], "path": str(path)}


async def code_fix(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    incident, action = state["incident"], state["recommended_action"]
    body = f"# {incident['id']}: {action['title']}\n{action['patch']}"
    # journaled: a resumed or retried visit returns the recorded PR, not a second one
    opened = await ctx.once("open-pr", _open_pull_request, str(ctx.config["fix_dir"]),
                            f"{ctx.run_id}-{incident['id']}", body)
    return {"code_fix": opened}
