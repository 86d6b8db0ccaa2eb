"""Deterministic, offline stand-ins for the audit agents (rule-based, no LLM).

Each node is a plain function over declared ``reads`` that returns one structured
field, the shape an ``agent:`` node would be asked for with an ``output:`` schema,
so an LLM agent can replace any of them without touching the graph:

    planner    engagement               -> plan {areas: [{name, objective, query}]}
    knowledge  plan                     -> knowledge [{area, query, hits: [...]}]  (hybrid search)
    risk       engagement, corrections,
               knowledge                -> risk {level, score, reason, factors}
    evidence   plan, knowledge, review,
               evidence                 -> evidence {round, items: [{area, claim, citations}]}
    reviewer   knowledge, evidence      -> review {verdict: accept|revise, round, gaps, ungrounded}
    escalate   risk, approval           -> escalation {...}                       (reject handler)
    report     ...                      -> report (text)

Only ``knowledge`` is not a stand-in: it really searches the bundled corpus
(``corpus.json``) with BM25 + embeddings fused by RRF (see ``retrieval.py``), and
the evidence cites what it retrieved -- the reviewer checks that it does.
"""

from __future__ import annotations

from typing import Any

import interlock

from . import retrieval

# ---- planner ----------------------------------------------------------------------

# (area, objective, search query): always planned, or planned when a fact is true
ALWAYS = [
    ("revenue", "test revenue cut-off around the year end",
     "revenue recognition cut-off testing of sales near period end"),
    ("journal entries", "test manual journals for management override",
     "journal entries posted by senior management outside normal hours"),
    ("bank", "agree bank balances to reconciliations",
     "monthly bank reconciliation reviewed by the controller"),
]
WHEN = {
    "new_erp_system": [
        ("system migration", "test the data migration into the new ERP",
         "data migration into the new ERP system and change management"),
        ("user access", "test access rights and segregation of duties in the ERP",
         "user access rights and segregation of duties in the ERP"),
    ],
    "material_inventory": [
        ("inventory", "attend the year-end stock count",
         "year-end physical stock count observation"),
    ],
    "related_party_transactions": [
        ("related parties", "identify and test related party transactions",
         "transactions with directors and related party disclosure"),
    ],
}


def plan(state: dict[str, Any]) -> dict[str, Any]:
    facts = state["engagement"]
    areas = [*ALWAYS]
    for fact, extra in WHEN.items():
        if facts.get(fact):
            areas += extra
    return {"plan": {"client": facts["client"],
                     "areas": [{"name": n, "objective": o, "query": q} for n, o, q in areas]}}


# ---- knowledge (real hybrid retrieval) ---------------------------------------------

def knowledge(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    index = retrieval.index()
    top_k = int(ctx.config["top_k"])
    candidates = int(ctx.config["candidates"])
    found = []
    for area in state["plan"]["areas"]:
        hits = index.search(area["query"], top_k=top_k, candidates=candidates)
        found.append({"area": area["name"], "query": area["query"],
                      "hits": [h.to_dict() for h in hits]})
    return {"knowledge": found}


# ---- risk ---------------------------------------------------------------------------

def assess_risk(state: dict[str, Any]) -> dict[str, Any]:
    """Score the engagement's risk factors; a human's ``corrections`` override facts."""
    facts = {**state["engagement"], **(state.get("corrections") or {})}
    factors: list[str] = []
    score = 0
    if facts.get("prior_findings", 0) >= 2:
        score += 2
        factors.append(f"{facts['prior_findings']} findings last year")
    if facts.get("new_erp_system"):
        score += 2
        factors.append("new ERP system this year")
    if facts.get("related_party_transactions"):
        score += 1
        factors.append("related party transactions")
    if facts.get("revenue_growth", 0) > 0.3:
        score += 1
        factors.append(f"revenue growth {facts['revenue_growth']:.0%}")
    # what retrieval surfaced counts too: an open finding for this very client
    client = facts["client"]
    docs = {h["doc"] for k in state["knowledge"] for h in k["hits"]}
    by_id = {d["id"]: d for d in retrieval.corpus()}
    open_findings = sorted(d for d in docs
                           if by_id[d]["kind"] == "finding" and by_id[d].get("client") == client)
    if open_findings:
        score += 1
        factors.append(f"prior finding(s) retrieved: {', '.join(open_findings)}")
    level = "HIGH" if score >= 5 else "MEDIUM" if score >= 3 else "LOW"
    reason = "; ".join(factors) or "no risk factor present"
    if state.get("corrections"):
        reason += f" (after corrections: {', '.join(sorted(state['corrections']))})"
    return {"risk": {"level": level, "score": score, "reason": reason, "factors": factors}}


# ---- evidence and review --------------------------------------------------------------

def gather_evidence(state: dict[str, Any]) -> dict[str, Any]:
    """Cite retrieved documents per area: the best one first, one more per revision asked."""
    previous = state.get("evidence")
    review = state.get("review")
    cited = {item["area"]: item["citations"] for item in previous["items"]} if previous else {}
    gaps = set(review["gaps"]) if review and review["verdict"] == "revise" else set()
    objectives = {a["name"]: a["objective"] for a in state["plan"]["areas"]}
    items = []
    for k in state["knowledge"]:
        area = k["area"]
        want = len(cited.get(area, [])) + (1 if area in gaps or area not in cited else 0)
        citations = [h["doc"] for h in k["hits"][:want]]
        items.append({"area": area, "claim": f"Planned: {objectives[area]}.",
                      "citations": citations})
    round_ = previous["round"] + 1 if previous else 1
    return {"evidence": {"round": round_, "items": items}}


def review(state: dict[str, Any], ctx: interlock.Context) -> dict[str, Any]:
    """Accept when every area cites enough documents, all of them actually retrieved."""
    need = int(ctx.config["min_citations"])
    retrieved = {k["area"]: {h["doc"] for h in k["hits"]} for k in state["knowledge"]}
    gaps, ungrounded = [], []
    for item in state["evidence"]["items"]:
        bad = [c for c in item["citations"] if c not in retrieved.get(item["area"], set())]
        ungrounded += [f"{item['area']}: {c}" for c in bad]
        if len(item["citations"]) - len(bad) < need:
            gaps.append(item["area"])
    verdict = "revise" if gaps or ungrounded else "accept"
    return {"review": {"verdict": verdict, "round": state["evidence"]["round"],
                       "gaps": gaps, "ungrounded": ungrounded}}


# ---- endings ---------------------------------------------------------------------------

def escalate(state: dict[str, Any]) -> dict[str, Any]:
    """The declared handler for a rejected HIGH-risk engagement."""
    gate = state["approval"]
    return {"escalation": {
        "to": "engagement partner",
        "risk": state["risk"]["level"],
        "reason": state["risk"]["reason"],
        "rejected_by": gate.get("by"),
        "comment": gate.get("comment"),
    }}


def report(state: dict[str, Any]) -> dict[str, Any]:
    risk, rev = state["risk"], state["review"]
    lines = [f"client: {state['plan']['client']}",
             f"risk: {risk['level']} ({risk['reason']})"]
    if "approval" in state:
        gate = state["approval"]
        lines.append(f"approval: {gate['decision']} by {gate.get('by') or 'anonymous'}")
    for item in state["evidence"]["items"]:
        lines.append(f"- {item['area']}: {item['claim']} [{', '.join(item['citations'])}]")
    if rev["verdict"] == "accept":
        lines.append(f"review: accepted in round {rev['round']}")
    else:
        lines.append(f"review: NOT accepted after {rev['round']} round(s); "
                     f"open gaps: {', '.join(rev['gaps'] + rev['ungrounded'])}")
    return {"report": "\n".join(lines)}
