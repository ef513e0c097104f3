#!/usr/bin/env bash
# `make test`'s suite, in two steps: the chart and integration tiers first; then the Kubernetes
# tier, which mostly waits on pods and control-plane loops, beside the unit and operator tiers
# (pure code, or kopf against kmock on loopback: nothing they share with it). Its output follows
# theirs. Every tier runs whatever an earlier one did; any failing fails the whole.
set -uo pipefail
PY="${1:?usage: test-tiers.sh PYTHON}"
log="$(mktemp -t kompaktor-k8s-tier.XXXXXX)"
trap 'rm -f "$log"' EXIT

"$PY" -m pytest -q --ignore=tests/k8s --ignore=tests/unit --ignore=tests/operator
first=$?

"$PY" -m pytest -q -p no:cacheprovider tests/k8s >"$log" 2>&1 &
k8s_pid=$!
"$PY" -m pytest -q tests/operator tests/unit
pure=$?
wait "$k8s_pid"
k8s=$?
echo "== the Kubernetes tier (run beside the unit and operator tiers), exit $k8s:"
cat "$log"
echo "== tiers: chart+integration exit $first, unit+operator exit $pure, kubernetes exit $k8s"
[[ $first -eq 0 && $pure -eq 0 && $k8s -eq 0 ]]
