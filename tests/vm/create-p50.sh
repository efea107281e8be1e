#!/usr/bin/env bash
# Create p50 of a running sandboxd, the same way on the VM tier's guest
# and on the host (tests/vm/run.sh runs both in one run, for the ratio in
# docs/performance.md): N sandboxes created one after another through the
# API (each timed by curl from request to response: the daemon answers a
# create once the sandbox's agent listens), each deleted right after.
# Prints the median in milliseconds; fails on any non-200 create.
#
#   bash tests/vm/create-p50.sh URL TOKEN N
set -euo pipefail
url=$1 token=$2 n=$3
times=()
for i in $(seq "$n"); do
    id="p50-$i"
    out=$(curl -sS -m 120 -o /dev/null -w '%{http_code} %{time_total}' \
        -H "Authorization: Bearer $token" -H 'content-type: application/json' \
        -X POST "$url/api/sandboxes" \
        --data "{\"sandbox_id\":\"$id\",\"thread_id\":\"t\",\"uid\":\"p50\"}")
    code=${out% *}
    if [ "$code" != 200 ]; then
        echo "create $id: HTTP $code" >&2
        exit 1
    fi
    times+=("${out#* }")
    curl -sS -m 120 -o /dev/null -H "Authorization: Bearer $token" -X DELETE "$url/api/sandboxes/$id"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{ t[NR] = $1 } END {
    m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "%.1f\n", m * 1000 }'
