#!/usr/bin/env bash
# A one-minute tour of interlock on the incident example (offline, no API key):
# a fan-out and a join, a human approval, a policy condition, a guarded fix that asks
# before it acts, then the run's trace and the check of its hash-chained log.
#
#   python3 -m venv .venv && . .venv/bin/activate && pip install -e . && bash examples/demo.sh
#
# Runs are stored in $INTERLOCK_STORE (default ./.interlock/runs.db); the "pull request"
# that the fix opens is a patch file under ./.interlock/fixes/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v interlock >/dev/null 2>&1; then
  echo "demo: the interlock command is not on PATH; install it first: pip install -e ." >&2
  exit 2
fi

WF=examples/incident/workflow.yaml
EVENT=examples/incident/events/checkout-500.json
RUN="demo-$(date +%s)-$$"

if [ -t 1 ]; then BOLD=$'\033[1m'; DIM=$'\033[2m'; OFF=$'\033[0m'; else BOLD=; DIM=; OFF=; fi

step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$OFF"; }
say() { printf '%s%s%s\n' "$DIM" "$*" "$OFF"; }

# expect CODE COMMAND...: show the command, run it, and stop the demo if it exits otherwise
expect() {
  local want=$1 rc=0
  shift
  printf '%s$ %s%s\n' "$BOLD" "$*" "$OFF"
  "$@" || rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "demo: expected exit code $want from '$*', got $rc" >&2
    exit 1
  fi
}

step "1. Check the workflow before running it"
expect 0 interlock validate "$WF"

step "2. Its graph (Mermaid): fan-out, join, approval gate, conditional fix"
expect 0 interlock graph "$WF"

step "3. Run it on a bundled error event: a checkout fails with HTTP 500"
say "intake, then retrieval and rag run concurrently, rca joins them; the run stops at the"
say "approval gate and exits 3 (waiting for a human). The process could end here."
expect 3 interlock run "$WF" --input-file "$EVENT" --run-id "$RUN"

step "4. What the approver is shown"
expect 3 interlock status "$RUN"

step "5. A human approves the RCA"
say "The policy edge decides: approved, confidence >= config.code_fix_min_confidence (0.5),"
say "severity not low -> code_fix. code_fix is guarded (confirm: true), so it asks first."
expect 3 interlock resume "$RUN" --gate approval --approve --by you --comment "the missing tax rate explains it"

step "6. ... and confirms the automated fix"
expect 0 interlock resume "$RUN" --gate code_fix --approve --by you

step "7. The trace: every node, every edge decision and the values it read"
expect 0 interlock trace "$RUN"

step "8. The log is hash-chained: check nobody rewrote it"
expect 0 interlock verify "$RUN"

step "9. The fix, written once (ctx.once: a resume never opens a second PR)"
for patch in .interlock/fixes/"$RUN"-*.patch; do
  say "$patch"
  cat "$patch"
done

printf '\n%sDone.%s Try another event: %s\n' "$BOLD" "$OFF" \
  "interlock run $WF --input-file examples/incident/events/payment-timeout.json"
say "(payment-timeout: approved but confidence 0.45 < 0.5 -> END; logo-404: severity low -> END;"
say " printer-crash: no RCA -> END; --set code_fix_min_confidence=0.3 changes the policy.)"
