#!/usr/bin/env bash
# Hibernation benchmark (issue #36): host memory of an idle sandbox holding
# a Python process with 100 MiB of live heap (a list of dicts of random
# strings) active, frozen and reclaimed (the cgroup, and the swap device's
# own memory: zram's compressed bytes), wake latency (request to the
# response head of an `echo` exec) from frozen and from reclaimed against
# an active sandbox, the heap's checksum and the time to touch it all
# again after a wake, with and without a prefetch of its pages, and the
# density of reclaimed sandboxes with a 50 MiB REPL each.
#
# Needs root. Each swap it measures is its own, made for the run and
# removed at the end whatever happens: zram0 with each compressor, and a
# swap file on disk (under /var/tmp). Refuses when the node already has
# swap or zram0 is in use. Uses the release build.
#
#   bash bench/idle.sh                       # lz4, lzo-rle, disk; 200 sandboxes for density (lz4)
#   BENCH_SWAPS="lz4 disk" BENCH_DENSITY=50 BENCH_SAMPLES=10 BENCH_PREFETCH_ROUNDS=3 bash bench/idle.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SWAPS=${BENCH_SWAPS:-"lz4 lzo-rle disk"}
DENSITY=${BENCH_DENSITY:-200}
SAMPLES=${BENCH_SAMPLES:-20}
[ "$(id -u)" = 0 ] || { echo "bench/idle.sh needs root" >&2; exit 1; }
[ -e /sys/block/zram0 ] || modprobe zram || { echo "no zram" >&2; exit 1; }
if [ "$(cat /sys/block/zram0/disksize)" != 0 ] || [ "$(wc -l < /proc/swaps)" -gt 1 ]; then
    echo "zram0 is in use or the node has swap already: refusing" >&2; exit 1
fi
CARGO_INCREMENTAL=0 cargo build --release -q
WORK=$(mktemp -d /tmp/sandboxd-bench-idle.XXXXXX)
SWAPFILE=/var/tmp/sandboxd-bench-idle-$$.swap
PARENT=sandboxd-bench-idle-$$
DPID=
swap_off() {
    swapoff /dev/zram0 2>/dev/null || true
    echo 1 > /sys/block/zram0/reset 2>/dev/null || true
    swapoff "$SWAPFILE" 2>/dev/null || true
    rm -f "$SWAPFILE"
}
cleanup() {
    local rc=$?
    if [ -n "$DPID" ]; then kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null || true; fi
    if [ "$rc" != 0 ]; then
        for l in "$WORK"/*/daemon.log; do [ -f "$l" ] && { echo "== $l"; tail -n 30 "$l"; }; done >&2
    fi
    swap_off
    for c in /sys/fs/cgroup/*/"$PARENT" /sys/fs/cgroup/"$PARENT"; do rmdir "$c"/* "$c" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
export BENCH_PARENT=$PARENT BENCH_DENSITY=$DENSITY BENCH_SAMPLES=$SAMPLES
OUT=$WORK/results
for swap in $SWAPS; do
    if [ "$swap" = disk ]; then
        fallocate -l 4G "$SWAPFILE" && chmod 600 "$SWAPFILE"
        mkswap "$SWAPFILE" >/dev/null && swapon "$SWAPFILE"
    else
        echo "$swap" > /sys/block/zram0/comp_algorithm
        echo 16G > /sys/block/zram0/disksize
        mkswap /dev/zram0 >/dev/null && swapon /dev/zram0
    fi
    TOKEN=bench-idle-token-0123456789abcdef0123456789
    mkdir -p "$WORK/$swap/state" "$WORK/$swap/ud" "$WORK/$swap/sk"
    SANDBOX_PROVISIONER_TOKEN=$TOKEN PROVISIONER_BACKEND=native SANDBOXD_NETWORK=none \
    SANDBOXD_USER_DATA_ROOT=$WORK/$swap/ud SANDBOXD_SKILLS_ROOT=$WORK/$swap/sk \
    SANDBOXD_CGROUP_PARENT=$PARENT SANDBOXD_STOP_SANDBOXES_ON_EXIT=true SANDBOXD_POOL_SIZE=0 \
    SANDBOX_IDLE_CHECK_INTERVAL_SECONDS=1 SANDBOXD_IDLE_FREEZE_SECONDS=1 SANDBOXD_IDLE_RECLAIM_SECONDS=2 \
    SANDBOX_IDLE_TIMEOUT_SECONDS=86400 SANDBOXD_LOG_FORMAT=text RUST_LOG=warn \
        ./target/release/sandboxd serve --listen 127.0.0.1:18736 --state-dir "$WORK/$swap/state" \
        2> "$WORK/$swap/daemon.log" &
    DPID=$!
    for _ in $(seq 100); do curl -sf http://127.0.0.1:18736/health >/dev/null && break; sleep 0.1; done
    BENCH_TOKEN=$TOKEN BENCH_SWAP=$swap python3 bench/idle.py | tee -a "$OUT"
    kill -TERM "$DPID"; wait "$DPID" 2>/dev/null || true; DPID=
    swap_off
done
echo; cat "$OUT"
