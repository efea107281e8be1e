#!/usr/bin/env bash
# Create-to-ready of native sandboxes with and without user namespaces, in
# one run: two release daemons side by side (`SANDBOXD_USERNS=on` and
# `off`, otherwise identical), creates alternating between them so that the
# machine's load weighs on both alike. Needs root and a release build
# (`cargo build --release`). Prints a Markdown table for
# docs/performance.md.
#
#   bash bench/userns.sh                      # 40 creates each, no network
#   BENCH_N=60 BENCH_NETWORK=egress bash bench/userns.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${BENCH_N:-40}
NET=${BENCH_NETWORK:-none}
BIN=target/release/sandboxd
[ -x "$BIN" ] && [ -x target/release/sandbox-init ] || { echo "run cargo build --release first" >&2; exit 1; }
TOKEN=bench-token-0123456789abcdef0123456789abcdef
WORK=$(mktemp -d /tmp/sandboxd-userns-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    for m in on off; do nft delete table inet "sbx_ub_$m" 2>/dev/null || true; done
    for c in /sys/fs/cgroup/*/; do
        for m in on off; do rmdir "$c/sandboxd-userns-bench-$m" 2>/dev/null || true; done
    done
    rmdir /sys/fs/cgroup/sandboxd-userns-bench-* 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

start() { # mode port subnet
    local m=$1 port=$2 subnet=$3
    mkdir -p "$WORK/$m"
    SANDBOX_PROVISIONER_TOKEN=$TOKEN PROVISIONER_BACKEND=native \
    SANDBOXD_USERNS=$m SANDBOXD_NETWORK=$NET \
    SANDBOXD_USER_DATA_ROOT="$WORK/$m/ud" SANDBOXD_SKILLS_ROOT="$WORK/$m/sk" \
    SANDBOXD_CGROUP_PARENT="sandboxd-userns-bench-$m" SANDBOXD_STOP_SANDBOXES_ON_EXIT=true \
    SANDBOXD_NETWORK_TABLE="sbx_ub_$m" SANDBOXD_NETWORK_LINK_PREFIX="ub$m-" SANDBOXD_NETWORK_SUBNET="$subnet" \
    RUST_LOG=info "$BIN" serve --listen "127.0.0.1:$port" --state-dir "$WORK/$m/state" \
        2>"$WORK/$m.log" &
    PIDS+=($!)
}
start on 18411 10.244.201.0/24
start off 18412 10.244.202.0/24
for port in 18411 18412; do
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.05; done
done
grep -q "user namespaces on" "$WORK/on.log" || { echo "the 'on' daemon has no user namespaces:" >&2; cat "$WORK/on.log" >&2; exit 1; }

create() { # port id -> ms
    local t0 t1 code
    t0=$(date +%s%N)
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
        -X POST "http://127.0.0.1:$1/api/sandboxes" -d "{\"sandbox_id\":\"$2\",\"thread_id\":\"t\",\"uid\":\"bench\"}")
    t1=$(date +%s%N)
    [ "$code" = 200 ] || { echo "create $2 on :$1 answered $code" >&2; exit 1; }
    echo $(( (t1 - t0) / 1000 ))
}
delete() {
    curl -s -o /dev/null -H "Authorization: Bearer $TOKEN" -X DELETE "http://127.0.0.1:$1/api/sandboxes/$2"
}
# Warm-up, then alternate.
create 18411 warm >/dev/null; delete 18411 warm
create 18412 warm >/dev/null; delete 18412 warm
: >"$WORK/on.us"; : >"$WORK/off.us"
for i in $(seq "$N"); do
    if (( i % 2 )); then order="on off"; else order="off on"; fi
    for m in $order; do
        port=18411; [ "$m" = off ] && port=18412
        create "$port" "b$i" >>"$WORK/$m.us"
    done
done
for i in $(seq "$N"); do delete 18411 "b$i"; delete 18412 "b$i"; done

pct() { # file fraction
    sort -n "$1" | awk -v f="$2" '{a[NR]=$1} END {i=int(NR*f+0.5); if(i<1)i=1; if(i>NR)i=NR; printf "%.1f", a[i]/1000}'
}
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -r)), release build, network $NET, $N creates per daemon, alternating;"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "| user namespaces | create-to-ready p50 ms | p95 ms |"
echo "|---|---|---|"
for m in on off; do echo "| $m | $(pct "$WORK/$m.us" 0.5) | $(pct "$WORK/$m.us" 0.95) |"; done
