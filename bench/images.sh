#!/usr/bin/env bash
# Image benchmark (docs/performance.md, "Images"), in one run on this node:
#
#  1. pull + unpack of an image served by a local registry (Debian's
#     docker-registry on a loopback port): `sandboxd image pull` against
#     `skopeo copy docker://... oci:...` followed by `umoci unpack`;
#  2. create-to-ready of a native sandbox from that image against host mode
#     (the host's /usr bound read-only), with SANDBOXD_NETWORK=none.
#
# Needs root, docker-registry, skopeo, umoci, busybox-static and curl
# (apt-get install docker-registry skopeo umoci busybox-static curl).
# Prints a Markdown section; nothing is written into the repository.
#
#   bash bench/images.sh               # payload: /usr/lib/python3.11, 3 pulls, 20 creates per mode
#   BENCH_PAYLOAD=/usr/share/doc BENCH_PULLS=5 BENCH_N=50 bash bench/images.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PAYLOAD=${BENCH_PAYLOAD:-$(ls -d /usr/lib/python3.[0-9]* | head -1)}
PULLS=${BENCH_PULLS:-3}
N=${BENCH_N:-20}
TOKEN=bench-token-0123456789abcdef0123456789abcdef

for tool in docker-registry skopeo umoci curl; do
    command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install docker-registry skopeo umoci busybox-static curl" >&2; exit 1; }
done
[ -x /bin/busybox ] || { echo "/bin/busybox is missing: apt-get install busybox-static" >&2; exit 1; }

cargo build --release -q
BIN=$PWD/target/release/sandboxd

W=$(mktemp -d /tmp/sandboxd-bench-images.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# --- the registry ------------------------------------------------------------
RPORT=$(free_port)
REG=127.0.0.1:$RPORT
cat >"$W/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $W/registry
http:
  addr: $REG
EOF
docker-registry serve "$W/registry.yml" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -fs "http://$REG/v2/" >/dev/null && break; sleep 0.1; done

# --- the image: busybox + the payload, one gzip layer (umoci) ----------------
umoci init --layout "$W/src" >/dev/null
umoci new --image "$W/src:bench" >/dev/null
umoci unpack --image "$W/src:bench" "$W/bundle" >/dev/null
mkdir -p "$W/bundle/rootfs/bin" "$W/bundle/rootfs/payload"
cp /bin/busybox "$W/bundle/rootfs/bin/"
for a in sh cat ls echo true; do ln -s busybox "$W/bundle/rootfs/bin/$a"; done
cp -a "$PAYLOAD" "$W/bundle/rootfs/payload/"
umoci repack --image "$W/src:bench" "$W/bundle" >/dev/null
skopeo --insecure-policy copy --quiet --dest-tls-verify=false "oci:$W/src:bench" "docker://$REG/bench/img:1"
REF=$REG/bench/img:1
UNPACKED=$(du -sb "$W/bundle/rootfs" | cut -f1)
FILES=$(find "$W/bundle/rootfs" | wc -l)
BLOB=$(du -sb "$W/registry/docker/registry/v2/blobs" | cut -f1)
rm -rf "$W/bundle"

# --- 1. pull + unpack ---------------------------------------------------------
ours=(); theirs=()
for i in $(seq "$PULLS"); do
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(now)
    SANDBOXD_INSECURE_REGISTRIES=$REG "$BIN" image pull --state-dir "$W/s$i" "$REF" >/dev/null 2>&1
    t1=$(now)
    ours+=("$(echo "$t1 - $t0" | bc)")
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(now)
    skopeo --insecure-policy copy --quiet --src-tls-verify=false "docker://$REF" "oci:$W/k$i:t"
    umoci unpack --image "$W/k$i:t" "$W/u$i" >/dev/null
    t1=$(now)
    theirs+=("$(echo "$t1 - $t0" | bc)")
    [ "$i" = 1 ] || rm -rf "$W/s$i"
    rm -rf "$W/k$i" "$W/u$i"
done
OURS=$(printf '%s\n' "${ours[@]}" | median | xargs printf '%.2f')
THEIRS=$(printf '%s\n' "${theirs[@]}" | median | xargs printf '%.2f')
mbps() { echo "scale=1; $UNPACKED / 1048576 / $1" | bc; }

# --- 2. create-to-ready, image vs host ---------------------------------------
create_times() { # $1: state dir, rest: env
    local state=$1; shift
    local port; port=$(free_port)
    env "$@" SANDBOX_PROVISIONER_TOKEN=$TOKEN PROVISIONER_BACKEND=native SANDBOXD_NETWORK=none \
        SANDBOXD_USER_DATA_ROOT="$W/ud" SANDBOXD_SKILLS_ROOT="$W/sk" SANDBOXD_CGROUP_PARENT=sandboxd-bench-img \
        SANDBOXD_STOP_SANDBOXES_ON_EXIT=true RUST_LOG=warn \
        "$BIN" serve --listen "127.0.0.1:$port" --state-dir "$state" 2>>"$W/daemon.log" &
    local pid=$!
    for _ in $(seq 200); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.05; done
    local times=()
    for i in $(seq "$N"); do
        local t
        t=$(curl -s -o "$W/out" -w '%{http_code} %{time_total}' -H "Authorization: Bearer $TOKEN" \
            -X POST "http://127.0.0.1:$port/api/sandboxes" \
            -d "{\"sandbox_id\":\"b$i\",\"thread_id\":\"t\",\"uid\":\"bench\",\"inherit_env\":false}")
        [ "${t%% *}" = 200 ] || { echo "create failed: $t $(cat "$W/out")" >&2; kill "$pid"; exit 1; }
        times+=("${t#* }")
        curl -s -o /dev/null -H "Authorization: Bearer $TOKEN" -X DELETE "http://127.0.0.1:$port/api/sandboxes/b$i"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    printf '%s\n' "${times[@]}" | median
}
mkdir -p "$W/ud" "$W/sk"
HOST=$(create_times "$W/host")
IMAGE=$(create_times "$W/s1" SANDBOX_IMAGE="$REF" SANDBOXD_INSECURE_REGISTRIES="$REG")

ms() { echo "scale=1; $1 * 1000 / 1" | bc; }
cat <<EOF
## Images

\`bash bench/images.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores, kernel $(uname -r)); an
image of one gzip layer (static busybox + \`$PAYLOAD\`: $(echo "scale=1; $UNPACKED/1048576" | bc) MiB
unpacked, $FILES entries, $(echo "scale=1; $BLOB/1048576" | bc) MiB of blobs in the registry)
served by a local \`docker-registry\` on loopback; medians of $PULLS pulls
into an empty store, page cache dropped before each.

| pull + unpack | seconds | unpacked MiB/s |
|---|---|---|
| \`sandboxd image pull\` (verify every blob, unpack, diff_ids, mount points) | $OURS | $(mbps "$OURS") |
| \`skopeo copy docker://… oci:…\` + \`umoci unpack\` | $THEIRS | $(mbps "$THEIRS") |

Create-to-ready (\`POST /api/sandboxes\` until it answers, then a delete;
median of $N, ephemeral sandboxes, \`SANDBOXD_NETWORK=none\`):

| mode | create p50 (ms) |
|---|---|
| host (\`/usr\` bound read-only) | $(ms "$HOST") |
| image (its rootfs as the root) | $(ms "$IMAGE") |
EOF
