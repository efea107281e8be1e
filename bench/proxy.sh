#!/usr/bin/env bash
# Proxy benchmark: requests/s and p50/p99 latency of a small GET at 1 and 8
# connections, straight to an upstream (nginx), through nginx's own
# `proxy_pass` (upstream keep-alive, the reference a reverse proxy is
# measured against) and through sandboxd's proxy (memory backend pointing
# at the same nginx), all measured in one run with wrk. For each
# connection count the three runs go back to back, ROUNDS times over (the
# two proxies in alternating order), and each figure is the median of its
# rounds (the machine is shared and noisy). Writes
# the figures into docs/performance.md between the PROXY markers. Needs
# root only for apt-get (wrk, nginx-light).
#
#   bash bench/proxy.sh [DURATION_SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dur="${1:-10}"
rounds="${2:-3}"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
fi
cargo build --release --quiet --bin sandboxd

work=$(mktemp -d)
cleanup() {
    [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    [ -f "$work/nginx-proxy.pid" ] && kill "$(cat "$work/nginx-proxy.pid")" 2>/dev/null || true
    [ -n "${sbd:-}" ] && kill "$sbd" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

up_port=18190; prov_port=18191; ngx_port=18192
cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$up_port;
        location / { return 200 "ok\n"; }
    }
}
NGINX
nginx -c "$work/nginx.conf"
# The reference proxy: nginx proxy_pass to the same upstream, upstream
# keep-alive on, as many workers as sandboxd has connection workers (the
# cores, where it serves the connections).
cat > "$work/nginx-proxy.conf" <<NGINX
worker_processes $(nproc);
pid $work/nginx-proxy.pid;
error_log $work/error-proxy.log;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    upstream up { server 127.0.0.1:$up_port; keepalive 32; }
    server {
        listen 127.0.0.1:$ngx_port;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
nginx -c "$work/nginx-proxy.conf"

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
start() { # port
    SANDBOX_PROVISIONER_TOKEN=$token PROVISIONER_BACKEND=memory \
    MEMORY_SANDBOX_URL_TEMPLATE="http://127.0.0.1:$up_port" RUST_LOG=warn \
        ./target/release/sandboxd serve --listen "127.0.0.1:$1" --state-dir "$work/state-$1" &
}
start "$prov_port"; sbd=$!
for port in "$prov_port"; do
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
    curl -sf -H "Authorization: Bearer $token" -X POST "http://127.0.0.1:$port/api/sandboxes" \
         -d '{"sandbox_id":"bench","thread_id":"t","uid":"u"}' >/dev/null
done

direct="http://127.0.0.1:$up_port/small"
via_nginx="http://127.0.0.1:$ngx_port/small"
proxied="http://127.0.0.1:$prov_port/api/sandboxes/bench/proxy/small"

# The CPU time (user + system, clock ticks) the processes PIDS... used so far.
ticks() {
    local t=0 p
    for p in "$@"; do
        t=$((t + $(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$p/stat")))
    done
    echo "$t"
}

# Prints "rps p50_us p99_us cpu_us_per_request" for one wrk run; the CPU is
# that of the processes whose PIDs are in the variable named by PIDS_VAR.
run() {
    local conns=$1 threads=$2 url=$3 pids_var=$4; shift 4
    local -n pids=$pids_var
    local before after
    before=$(ticks "${pids[@]}")
    wrk -t"$threads" -c"$conns" -d"${dur}s" --latency "$@" "$url" > "$work/wrk.out"
    after=$(ticks "${pids[@]}")
    awk -v cpu=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000; if (v ~ /s$/) return (v+0)*1000000; return v }
        /Requests\/sec/ { rps=$2 }
        / requests in / { n=$1 }
        $1=="50%" { p50=us($2) }
        $1=="99%" { p99=us($2) }
        END { printf "%.0f %.0f %.0f %.1f\n", rps, p50, p99, (n ? cpu / hz * 1000000 / n : 0) }' "$work/wrk.out"
}

# The median of the numbers on stdin.
median() { sort -n | awk '{v[NR]=$1} END { print v[int((NR+1)/2)] }'; }

# Whose CPU each run counts: nginx proxy_pass's workers, each sandboxd.
no_pids=()
ngx_pids=($(pgrep -P "$(cat "$work/nginx-proxy.pid")"))
sbd_pids=("$sbd")

rows=""
for c in 1 8; do
    t=$([ "$c" = 1 ] && echo 1 || echo 2)
    : > "$work/runs"
    for r in $(seq "$rounds"); do
        echo "d $(run "$c" "$t" "$direct" no_pids)" >> "$work/runs"
        # The two proxies in a different order each round: a run right
        # after another measured slower here, whichever proxy it was.
        case $(( r % 2 )) in
            1) order="n p" ;;
            0) order="p n" ;;
        esac
        for k in $order; do
            case $k in
                n) echo "n $(run "$c" "$t" "$via_nginx" ngx_pids)" ;;
                p) echo "p $(run "$c" "$t" "$proxied" sbd_pids -H "Authorization: Bearer $token")" ;;
            esac >> "$work/runs"
        done
    done
    # fig KIND COLUMN: the median of one figure over the rounds.
    fig() { awk -v k="$1" -v col="$2" '$1==k { print $col }' "$work/runs" | median; }
    d_rps=$(fig d 2); d_p50=$(fig d 3)
    n_rps=$(fig n 2); n_p50=$(fig n 3); n_cpu=$(fig n 5)
    p_rps=$(fig p 2); p_p50=$(fig p 3); p_p99=$(fig p 4); p_cpu=$(fig p 5)
    vs_nginx=$(awk -v a="$p_rps" -v b="$n_rps" 'BEGIN{printf "%.2f", a/b}')
    n_added=$((n_p50 - d_p50)); p_added=$((p_p50 - d_p50))
    rows+="| $c | $d_rps | $d_p50 | $n_rps | $n_p50 | $n_added | $n_cpu | $p_rps | $p_p50 | $p_p99 | $p_added | $p_cpu | $vs_nginx |"$'\n'
    echo "conns=$c direct: $d_rps req/s p50 ${d_p50}us | nginx: $n_rps req/s p50 ${n_p50}us (+${n_added}) ${n_cpu}us CPU/req | sandboxd: $p_rps req/s p50 ${p_p50}us p99 ${p_p99}us (+${p_added}) ${p_cpu}us CPU/req | sandboxd/nginx $vs_nginx"
done

section=$(cat <<MD
<!-- PROXY:BEGIN (written by bench/proxy.sh) -->
Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -r)), \`bash bench/proxy.sh ${dur} ${rounds}\`: wrk ${dur}s per run, nginx
upstream returning 3 bytes; nginx \`proxy_pass\` ($(nproc) workers, upstream keep-alive) and sandboxd's proxy (release build,
memory backend) in front of the same upstream; for each connection count the three runs back to back,
${rounds} rounds with the two proxies in alternating order, each figure the median of its rounds; CPU is the
proxy's user + system time over the run (\`/proc/<pid>/stat\`, all of nginx's workers) divided by the requests served.

| conns | direct req/s | direct p50 µs | nginx req/s | nginx p50 µs | nginx added p50 µs | nginx CPU µs/req | sandboxd req/s | sandboxd p50 µs | sandboxd p99 µs | sandboxd added p50 µs | sandboxd CPU µs/req | sandboxd / nginx req/s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
${rows}
Goal (issue #31): sandboxd ≥ 0.9 × nginx \`proxy_pass\` in req/s at 8 connections.
<!-- PROXY:END -->
MD
)
python3 - "$section" <<'PY'
import pathlib, re, sys
p = pathlib.Path("docs/performance.md")
text = p.read_text() if p.exists() else "# Performance\n\nFigures written by the scripts in `bench/`; re-run them to refresh.\n\n## Proxy\n\n<!-- PROXY:BEGIN -->\n<!-- PROXY:END -->\n"
new = re.sub(r"<!-- PROXY:BEGIN.*?<!-- PROXY:END -->", lambda m: sys.argv[1], text, flags=re.S)
p.write_text(new)
PY
echo "wrote docs/performance.md"
