#!/usr/bin/env bash
# `make test`'s suite: the Kubernetes tier, which mostly waits on pods, image imports and
# control-plane loops, starts first and runs beside the chart and integration tiers, then the
# unit and operator tiers (pure code, or kopf against kmock on loopback). They share nothing with
# it (its control planes, node and S3 servers are its own, on ports and a bridge of their own).
# The few tests marked `quiet` — demos held to a wall-clock bound, which a machine loaded by two
# tiers at once can miss — run last, once the Kubernetes tier is done. Its output follows the
# others'. Every tier runs whatever an earlier one did; any failing fails the whole. Each tier's
# wall time is printed at the end.
set -uo pipefail
PY="${1:?usage: test-tiers.sh PYTHON}"
log="$(mktemp -t kompaktor-k8s-tier.XXXXXX)"
trap 'rm -f "$log"' EXIT
t0=$SECONDS

( s=$SECONDS; "$PY" -m pytest -q -p no:cacheprovider tests/k8s; rc=$?
  echo "== the Kubernetes tier took $((SECONDS - s)) s"; exit $rc ) >"$log" 2>&1 &
k8s_pid=$!

s=$SECONDS
"$PY" -m pytest -q -m "not quiet" --ignore=tests/k8s --ignore=tests/unit --ignore=tests/operator
first=$?
first_s=$((SECONDS - s))
s=$SECONDS
"$PY" -m pytest -q tests/operator tests/unit
pure=$?
pure_s=$((SECONDS - s))
wait "$k8s_pid"
k8s=$?
s=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider -m quiet --ignore=tests/k8s --ignore=tests/unit --ignore=tests/operator
quiet=$?
quiet_s=$((SECONDS - s))
echo "== the Kubernetes tier (run beside the other tiers), exit $k8s:"
cat "$log"
echo "== tiers: chart+integration exit $first in $first_s s, unit+operator exit $pure in $pure_s s," \
  "kubernetes exit $k8s, quiet exit $quiet in $quiet_s s; all in $((SECONDS - t0)) s"
[[ $first -eq 0 && $pure -eq 0 && $k8s -eq 0 && $quiet -eq 0 ]]
