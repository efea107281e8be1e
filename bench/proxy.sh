#!/usr/bin/env bash
# Proxy benchmark: requests/s and p50/p99 latency of a small GET at 1 and 8
# connections, straight to an upstream (nginx), through nginx's own
# `proxy_pass` (upstream keep-alive, the reference a reverse proxy is
# measured against) and through sandboxd's proxy (memory backend pointing
# at the same nginx), measured in one run with wrk, the three runs back to
# back for each connection count. Writes the figures into
# docs/performance.md between the PROXY markers. Needs root only for
# apt-get (wrk, nginx-light).
#
#   bash bench/proxy.sh [DURATION_SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dur="${1:-10}"

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
# keep-alive on, as many workers as sandboxd has tokio workers (the cores).
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
SANDBOX_PROVISIONER_TOKEN=$token PROVISIONER_BACKEND=memory \
MEMORY_SANDBOX_URL_TEMPLATE="http://127.0.0.1:$up_port" RUST_LOG=warn \
    ./target/release/sandboxd serve --listen "127.0.0.1:$prov_port" --state-dir "$work/state" &
sbd=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$prov_port/health" >/dev/null && break; sleep 0.1; done
curl -sf -H "Authorization: Bearer $token" -X POST "http://127.0.0.1:$prov_port/api/sandboxes" \
     -d '{"sandbox_id":"bench","thread_id":"t","uid":"u"}' >/dev/null

direct="http://127.0.0.1:$up_port/small"
via_nginx="http://127.0.0.1:$ngx_port/small"
proxied="http://127.0.0.1:$prov_port/api/sandboxes/bench/proxy/small"

# Prints "rps p50_us p99_us" for one wrk run.
run() {
    local conns=$1 threads=$2 url=$3; shift 3
    wrk -t"$threads" -c"$conns" -d"${dur}s" --latency "$@" "$url" > "$work/wrk.out"
    awk '
        function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000; if (v ~ /s$/) return (v+0)*1000000; return v }
        /Requests\/sec/ { rps=$2 }
        $1=="50%" { p50=us($2) }
        $1=="99%" { p99=us($2) }
        END { printf "%.0f %.0f %.0f\n", rps, p50, p99 }' "$work/wrk.out"
}

rows=""
for c in 1 8; do
    t=$([ "$c" = 1 ] && echo 1 || echo 2)
    read -r d_rps d_p50 d_p99 < <(run "$c" "$t" "$direct")
    read -r n_rps n_p50 n_p99 < <(run "$c" "$t" "$via_nginx")
    read -r p_rps p_p50 p_p99 < <(run "$c" "$t" "$proxied" -H "Authorization: Bearer $token")
    vs_nginx=$(awk -v a="$p_rps" -v b="$n_rps" 'BEGIN{printf "%.2f", a/b}')
    n_added=$((n_p50 - d_p50)); p_added=$((p_p50 - d_p50))
    rows+="| $c | $d_rps | $d_p50 | $n_rps | $n_p50 | $n_added | $p_rps | $p_p50 | $p_p99 | $p_added | $vs_nginx |"$'\n'
    echo "conns=$c direct: $d_rps req/s p50 ${d_p50}us | nginx: $n_rps req/s p50 ${n_p50}us (+${n_added}) | sandboxd: $p_rps req/s p50 ${p_p50}us p99 ${p_p99}us (+${p_added}) | sandboxd/nginx $vs_nginx"
done

section=$(cat <<MD
<!-- PROXY:BEGIN (written by bench/proxy.sh) -->
Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -r)), \`bash bench/proxy.sh ${dur}\`: wrk ${dur}s per run, nginx upstream
returning 3 bytes; nginx \`proxy_pass\` ($(nproc) workers, upstream keep-alive) and sandboxd's proxy (release build, memory
backend) in front of the same upstream; for each connection count the three runs back to back.

| conns | direct req/s | direct p50 µs | nginx req/s | nginx p50 µs | nginx added p50 µs | sandboxd req/s | sandboxd p50 µs | sandboxd p99 µs | sandboxd added p50 µs | sandboxd / nginx req/s |
|---|---|---|---|---|---|---|---|---|---|---|
${rows}
Goal: sandboxd ≥ nginx \`proxy_pass\` in req/s and ≤ nginx in added p50.
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
