#!/usr/bin/env bash
# The VM tier's checks, run inside the guest (a pure cgroup v2 Debian 12
# with systemd as PID 1) by its vm-tier.service, from the run's payload
# (tests/vm/run.sh puts this file there; it is not part of the cached
# image). Results: one line per check, `PASS <name>` or `FAIL <name>:
# <why>`, in out/results.txt and, as it happens, on the virtio-serial port
# tier.results; each check's output in out/check-<name>.log; the
# integration tests' output in out/it.log; the boot's journal in
# out/journal.txt; the measured figures in out/figures.txt. The runner
# hands out/ back on the results disk.
#
# A check is a function run by `check` in a bash of its own under
# `set -eo pipefail`, with a time limit: it passes only when it returns 0,
# and every assertion in it is a command whose failure ends it (`must`
# says which one failed). No check is skipped: a check that cannot run
# fails. The checks depend on each other's state in order (the package
# installed, the daemon running, sandbox "keep" alive across restarts).
set -uo pipefail
set -a
T=/var/tmp/tier
OUT=$T/out
RES=$OUT/results.txt
PORT=/dev/virtio-ports/tier.results
# REPO (the host checkout's absolute path: the integration test binary
# finds its files there), SLOT_BASE, IT_ARGS (the test binary's filters),
# RUN_IT (0: the integration tests are not run, which is a failure),
# IT_THREADS (their --test-threads),
# CREATE_N, SLOW (a factor
# on every time limit: 1 with KVM, more under TCG).
. "$T/env"
URL=http://127.0.0.1:8002
CG=/sys/fs/cgroup
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
set +a

now() { cut -d' ' -f1 /proc/uptime; }
log() { echo "[$(now)] $*"; }

# must CMD...: runs CMD; on failure says which assertion failed and
# returns 1 (which ends the check: it runs under set -e).
must() {
    if ! "$@"; then
        echo "ASSERTION FAILED: $*" >&2
        return 1
    fi
}
# has TEXT NEEDLE: TEXT contains NEEDLE.
has() { [[ "$1" == *"$2"* ]] || { echo "expected ${2@Q} in: ${1@Q}" >&2; return 1; }; }
# eq A B
eq() { [ "$1" = "$2" ] || { echo "expected ${2@Q}, got ${1@Q}" >&2; return 1; }; }

token() { cat /var/lib/sandboxd/token; }
# api METHOD PATH [JSON]: the body on a 2xx answer; fails otherwise.
api() {
    curl -sS --fail-with-body -m 150 -H "Authorization: Bearer $(token)" \
        -H 'content-type: application/json' -X "$1" "$URL$2" ${3:+--data "$3"}
}
# status METHOD PATH: the HTTP status only.
status() {
    curl -s -o /dev/null -w '%{http_code}' -m 60 -H "Authorization: Bearer $(token)" -X "$1" "$URL$2"
}
create() { # ID [RESOURCES-JSON]
    api POST /api/sandboxes "{\"sandbox_id\":\"$1\",\"thread_id\":\"t\",\"uid\":\"u-$1\"${2:+,\"resources\":$2}}"
}
# sx ID COMMAND: runs COMMAND in the sandbox; prints its output; fails
# when the exec call fails (not when the command does: see sxc).
sx() {
    local body
    body=$(jq -nc --arg c "$2" '{command: $c, timeout: 60}')
    api POST "/api/sandboxes/$1/proxy/v1/shell/exec" "$body" | jq -r '.data.output'
}
# sxc ID COMMAND: the command's exit code.
sxc() {
    local body
    body=$(jq -nc --arg c "$2" '{command: $c, timeout: 60}')
    api POST "/api/sandboxes/$1/proxy/v1/shell/exec" "$body" | jq -r '.data.exit_code'
}
state_pid() { jq -r .pid "/var/lib/sandboxd/sandboxes/$1/state.json"; }
main_pid() { systemctl show -p MainPID --value sandboxd; }
journal_since() { journalctl -u sandboxd --since "@$1" -o cat --no-pager; }
active() { eq "$(systemctl is-active "$1")" active; }
figure() { echo "$1=$2" >> "$OUT/figures.txt"; }
result() {
    echo "$1" >> "$RES"
    if [ -w "$PORT" ]; then echo "$1" > "$PORT"; fi
}
# mark NAME: tells the host the guest got there (run.sh notes when the
# line arrives, for the time from qemu's start).
mark() { if [ -w "$PORT" ]; then echo "MARK $1" > "$PORT"; fi; }

check() { # NAME LIMIT-SECONDS FUNCTION
    local name=$1 limit=$2 fn=$3 t0 rc
    log "--- $name"
    t0=$(date +%s.%N)
    limit=$((limit * SLOW))
    timeout -k 5 "$limit" bash -c 'set -eo pipefail; "$@"' check "$fn" \
        > "$OUT/check-$name.log" 2>&1
    rc=$?
    local took
    took=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')
    if [ "$rc" = 0 ]; then
        result "PASS $name"
        log "PASS $name (${took}s)"
    else
        local why="exit $rc"
        [ "$rc" = 124 ] && why="timed out after ${limit}s"
        why="$why; $(grep -m1 -E 'ASSERTION FAILED|expected ' "$OUT/check-$name.log" | cut -c1-300)"
        result "FAIL $name: $why (out/check-$name.log)"
        log "FAIL $name: $why"
        tail -n 20 "$OUT/check-$name.log" | sed 's/^/    /'
    fi
}

# ---------------------------------------------------------------- checks

host_is_pure_v2_under_systemd() {
    eq "$(stat -fc %T /sys/fs/cgroup)" cgroup2fs
    must test -z "$(awk '$3 == "cgroup"' /proc/self/mounts)"
    eq "$(cat /proc/1/comm)" systemd
    has "$(cat /proc/cmdline)" systemd.unified_cgroup_hierarchy=1
    has "$(cat $CG/cgroup.subtree_control)" memory
    # The checks run in a unit of their own, like any service.
    eq "$(cut -d: -f3 /proc/self/cgroup)" /system.slice/vm-tier.service
}

package_installs_enabled_not_started() {
    local out
    out=$(dpkg -i "$T/sandboxd.deb" 2>&1)
    echo "$out"
    has "$out" "enabled, not started"
    eq "$(systemctl is-enabled sandboxd.service)" enabled
    eq "$(systemctl is-enabled sandboxd.socket)" disabled
    must test "$(systemctl is-active sandboxd.service)" != active
    systemd-analyze verify /usr/lib/systemd/system/sandboxd.service \
        /usr/lib/systemd/system/sandboxd.socket
    out=$(sandboxd doctor 2>&1) || true
    echo "$out"
    has "$out" "device rules enforced (BPF device program)"
    has "$out" "v2 layout"
    # The egress check's "internet" lives at TEST-NET-2, which the
    # default policy denies: allowed for this node, as an operator would.
    echo 'SANDBOXD_NETWORK_ALLOW=198.51.100.0/24' > /etc/sandboxd/sandboxd.env
    chmod 0600 /etc/sandboxd/sandboxd.env
}

start_is_ready_with_notify() {
    local t0 t1 pid
    t0=$(now)
    systemctl start sandboxd
    t1=$(now)
    mark sandboxd_ready
    figure boot_to_ready_s "$t1"
    figure start_s "$(awk -v a="$t1" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')"
    # systemd's own account: the main process started, then READY=1.
    figure exec_to_ready_s "$(awk -v a="$(systemctl show -p ActiveEnterTimestampMonotonic --value sandboxd)" \
        -v b="$(systemctl show -p ExecMainStartTimestampMonotonic --value sandboxd)" \
        'BEGIN {printf "%.2f", (a - b) / 1e6}')"
    active sandboxd
    eq "$(systemctl show -p Type --value sandboxd)" notify
    eq "$(systemctl show -p NotifyAccess --value sandboxd)" main
    eq "$(systemctl show -p WatchdogUSec --value sandboxd)" 30s
    has "$(systemctl show -p StatusText --value sandboxd)" "serving"
    must test -s /var/lib/sandboxd/token
    eq "$(stat -c %a /var/lib/sandboxd/token)" 600
    eq "$(curl -s -o /dev/null -w '%{http_code}' $URL/health)" 200
    local j
    j=$(journalctl -u sandboxd -b -o cat --no-pager)
    echo "$j"
    has "$j" "cgroup layout detected"
    has "$j" "device allow-list enforced by a BPF device program"
    must test -z "$(echo "$j" | grep -iE 'reception only permitted|Got notification message from PID' || true)"
    pid=$(main_pid)
    # The default parent lies outside the unit: the daemon stays where
    # systemd put it.
    eq "$(cut -d: -f3 /proc/$pid/cgroup)" /system.slice/sandboxd.service
}

logs_reach_the_journal_as_fields() {
    local j
    # The daemon's own journald layer: fields, not a text line on stderr.
    j=$(journalctl -u sandboxd -b -o json --no-pager | grep '"cgroup layout detected"' | head -n1)
    echo "$j"
    has "$j" '"LAYOUT":"v2"'
    has "$j" '"SYSLOG_IDENTIFIER":"sandboxd"'
    has "$j" '"PRIORITY":"6"'
    has "$j" '"_TRANSPORT":"journal"'
    # Nothing on the unit's stdout/stderr stream: every line of the
    # daemon goes through the journald layer, once.
    eq "$(journalctl -u sandboxd -b -o cat --no-pager _TRANSPORT=stdout | wc -l)" 0
    eq "$(journalctl -u sandboxd -b -o cat --no-pager | grep -c 'cgroup layout detected')" 1
}

api_create_exec_delete() {
    local v out
    v=$(create vm1)
    echo "$v"
    eq "$(echo "$v" | jq -r .status)" running
    out=$(sx vm1 'id -u; cat /proc/self/cgroup; echo done')
    echo "$out"
    has "$out" $'1000\n0::/\ndone'
    must test -d $CG/sandboxd/vm1
    eq "$(cut -d: -f3 /proc/$(state_pid vm1)/cgroup)" /sandboxd/vm1
    api DELETE /api/sandboxes/vm1
    eq "$(status GET /api/sandboxes/vm1)" 404
    must test ! -e $CG/sandboxd/vm1
}

limits_memory_pids_cpu() {
    create lim '{"memory_mb":64,"pids":32,"cpus":0.5}'
    local c=$CG/sandboxd/lim out u0 u1 t0 t1
    eq "$(cat $c/memory.max)" 67108864
    eq "$(cat $c/memory.swap.max)" 0
    eq "$(cat $c/pids.max)" 32
    eq "$(cat $c/cpu.max)" "50000 100000"
    # Memory: the hog is OOM-killed inside, the agent survives, the
    # sandbox reports it.
    out=$(sx lim "python3 -c 'b = b\"x\" * (200 << 20)'; echo rc=\$?")
    echo "hog: $out"
    has "$out" "rc=137"
    must grep -qE '^oom_kill [1-9]' $c/memory.events
    eq "$(sx lim 'echo alive')" alive
    eq "$(api GET /api/sandboxes/lim | jq -r .oom_killed)" true
    # pids: forks beyond pids.max fail with EAGAIN.
    out=$(sx lim 'python3 - <<EOF
import os, time
kids, refused = [], 0
for i in range(60):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids), "refused", refused)
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
EOF')
    echo "forks: $out"
    has "$out" "forked"
    must test "$(echo "$out" | awk '{print $4}')" -gt 0
    must test "$(echo "$out" | awk '{print $2}')" -lt 32
    must grep -qE '^max [1-9]' $c/pids.events
    # cpu: two spinners for 3 s get half a CPU between them.
    u0=$(awk '/^usage_usec/ {print $2}' $c/cpu.stat)
    t0=$(date +%s%N)
    sx lim 'timeout 3 sh -c "while :; do :; done" & timeout 3 sh -c "while :; do :; done"; wait' >/dev/null
    t1=$(date +%s%N)
    u1=$(awk '/^usage_usec/ {print $2}' $c/cpu.stat)
    local ratio
    ratio=$(awk -v u="$((u1 - u0))" -v t="$((t1 - t0))" 'BEGIN {printf "%.3f", u * 1000 / t}')
    echo "cpu used / wall time at cpus=0.5: $ratio"
    must awk -v r="$ratio" 'BEGIN {exit !(r <= 0.62 && r >= 0.30)}'
    must grep -qE '^nr_throttled [1-9]' $c/cpu.stat
    api DELETE /api/sandboxes/lim
}

device_allow_list_enforced() {
    create dev
    local c=$CG/sandboxd/dev out pid
    out=$(bpftool cgroup show $c)
    echo "$out"
    has "$out" "sandboxd_dev"
    has "$out" "cgroup_device"
    # The allowed devices work inside.
    out=$(sx dev 'echo x > /dev/null && head -c 3 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c')
    eq "$out" $'3\n4'
    # A node outside the list planted into the sandbox's own /dev (a
    # tmpfs without nodev): refused by the cgroup.
    pid=$(state_pid dev)
    mknod "/proc/$pid/root/dev/planted-tun" c 10 200
    chmod 0666 "/proc/$pid/root/dev/planted-tun"
    out=$(sx dev 'head -c 1 /dev/planted-tun; echo " rc=$?"' 2>&1)
    echo "planted: $out"
    has "$out" "Operation not permitted"
    # Root with every capability, in the sandbox's cgroup: no mknod of a
    # block device, no opening of the host's disk; /dev/null still opens.
    # The same shell outside the cgroup can do both: the refusal is the
    # cgroup's, not a missing capability's.
    rm -f /root/blk-in /root/blk-out
    out=$(sh -c "echo \$\$ > $c/cgroup.procs; mknod /root/blk-in b 7 0 2>&1; echo mknod=\$?; \
        head -c 1 /dev/vda >/dev/null 2>&1; echo vda=\$?; head -c 1 /dev/null; echo null=\$?")
    echo "inside: $out"
    has "$out" "Operation not permitted"
    has "$out" "mknod=1"
    has "$out" "vda=1"
    has "$out" "null=0"
    must test ! -e /root/blk-in
    out=$(sh -c "mknod /root/blk-out b 7 0 2>&1; echo mknod=\$?; head -c 1 /dev/vda >/dev/null; echo vda=\$?")
    echo "outside: $out"
    has "$out" "mknod=0"
    has "$out" "vda=0"
    rm -f /root/blk-out
    api DELETE /api/sandboxes/dev
}

egress_down() {
    ip netns pids vminet 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del vminet 2>/dev/null || true
    ip link del vmt-h 2>/dev/null || true
    ip route del 198.51.100.0/24 2>/dev/null || true
    ip route del 10.213.7.0/24 2>/dev/null || true
}

egress_policy_in_a_test_netns() {
    # The "internet": a network namespace behind a veth of its own, with a
    # public (TEST-NET-2, allowed above) and a private address; removed on
    # the way out whatever happens (the network integration tests use the
    # same addresses).
    trap egress_down EXIT
    trap 'egress_down; exit 1' TERM
    egress_down
    ip netns add vminet
    ip link add vmt-h type veth peer name vmt-n
    ip link set vmt-n netns vminet
    ip addr add 203.0.113.1/30 dev vmt-h
    ip link set vmt-h up
    ip -n vminet addr add 203.0.113.2/30 dev vmt-n
    ip -n vminet link set vmt-n up
    ip -n vminet link set lo up
    ip -n vminet addr add 198.51.100.10/32 dev lo
    ip -n vminet addr add 10.213.7.2/32 dev lo
    ip -n vminet route add default via 203.0.113.1
    ip route add 198.51.100.0/24 via 203.0.113.2
    ip route add 10.213.7.0/24 via 203.0.113.2
    for a in 198.51.100.10 10.213.7.2; do
        ip netns exec vminet python3 -m http.server 80 --bind $a >/dev/null 2>&1 &
    done
    # Both servers answer from the host before the sandbox tries.
    local i out
    for a in 198.51.100.10 10.213.7.2; do
        for i in $(seq 100); do
            curl -s -m 2 -o /dev/null "http://$a/" && break
            sleep 0.3
        done
        curl -s -m 5 -o /dev/null "http://$a/"
    done
    create net
    out=$(sx net "curl -s -m $((5 * SLOW)) -o /dev/null -w 'public %{http_code}\n' http://198.51.100.10/; \
        curl -s -m $((3 * SLOW)) -o /dev/null http://10.213.7.2/; echo \"private rc=\$?\"; \
        curl -s -m $((3 * SLOW)) -o /dev/null http://169.254.169.254/; echo \"metadata rc=\$?\"")
    echo "$out"
    has "$out" "public 200"
    has "$out" "private rc="
    has "$out" "metadata rc="
    must test -z "$(echo "$out" | grep -E '^(private|metadata) rc=0$' || true)"
    nft list table inet sandboxd >/dev/null
    api DELETE /api/sandboxes/net
}

user_namespace_and_idmapped_workspace() {
    local out pid base f
    has "$(journalctl -u sandboxd -b -o cat --no-pager)" "user namespaces on"
    create uns
    out=$(sx uns 'cat /proc/self/uid_map; id -u; echo hi > /home/gem/user-data/f; stat -c %u:%g /home/gem/user-data/f')
    echo "$out"
    base=$(echo "$out" | awk 'NR == 1 {print $2}')
    eq "$(echo "$out" | awk 'NR == 1 {print $1, $3}')" "0 65536"
    must test "$base" -ge 2147483648
    eq "$(echo "$out" | sed -n 2p)" 1000
    eq "$(echo "$out" | sed -n 3p)" 1000:1000
    pid=$(state_pid uns)
    has "$(grep ^Uid /proc/$pid/status)" "$((base + 1000))"
    f=$(find /var/lib/sandboxd/user-data -name f -path '*u-uns*' | head -n1)
    must test -n "$f"
    eq "$(stat -c %u:%g "$f")" 1000:1000
    api DELETE /api/sandboxes/uns
}

restart_keeps_sandboxes() {
    local gen pid old t0 out
    gen=$(create keep | jq -r .generation)
    pid=$(state_pid keep)
    old=$(main_pid)
    t0=$(date +%s)
    systemctl restart sandboxd
    active sandboxd
    must test "$(main_pid)" != "$old"
    must kill -0 "$pid"
    eq "$(state_pid keep)" "$pid"
    out=$(api GET /api/sandboxes/keep)
    echo "$out"
    eq "$(echo "$out" | jq -r .status)" running
    eq "$(echo "$out" | jq -r .generation)" "$gen"
    eq "$(sx keep 'echo after-restart')" after-restart
    has "$(journal_since "$t0")" "adopted"
    eq "$(systemctl show -p NRestarts --value sandboxd)" 0
}

watchdog_is_fed() {
    # A short watchdog (a runtime drop-in): the daemon must ping every
    # 1.5 s or systemd kills it.
    mkdir -p /run/systemd/system/sandboxd.service.d
    printf '[Service]\nWatchdogSec=3s\n' > /run/systemd/system/sandboxd.service.d/vm-watchdog.conf
    systemctl daemon-reload
    systemctl restart sandboxd
    local w0 w1 pid
    pid=$(main_pid)
    w0=$(systemctl show -p WatchdogTimestampMonotonic --value sandboxd)
    sleep 7
    w1=$(systemctl show -p WatchdogTimestampMonotonic --value sandboxd)
    echo "watchdog timestamps $w0 -> $w1"
    must test "$w1" -gt "$w0"
    eq "$(main_pid)" "$pid"
    active sandboxd
    rm /run/systemd/system/sandboxd.service.d/vm-watchdog.conf
    systemctl daemon-reload
    systemctl restart sandboxd
    eq "$(sx keep 'echo still')" still
}

socket_activation() {
    local t0 out fails
    systemctl stop sandboxd
    systemctl start sandboxd.socket
    must test "$(systemctl is-active sandboxd.service)" != active
    t0=$(date +%s)
    # The first connection starts the service.
    eq "$(curl -s -o /dev/null -w '%{http_code}' -m 60 $URL/health)" 200
    active sandboxd
    has "$(journal_since "$t0")" "socket activation: serving on the sockets passed by systemd"
    eq "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket /run/sandboxd/api.sock http://sandboxd/health)" 200
    eq "$(sx keep 'echo via-socket')" via-socket
    # A restart under load: connections wait in the socket's backlog,
    # none is refused.
    (for i in $(seq 150); do
        curl -s -o /dev/null -m 30 -w '%{http_code}\n' $URL/health || echo "curl-rc=$?"
        sleep 0.02
    done) > /tmp/under-restart.txt &
    local loader=$!
    sleep 0.5
    systemctl restart sandboxd
    wait $loader
    fails=$(grep -vc '^200$' /tmp/under-restart.txt || true)
    echo "requests during the restart: $(wc -l < /tmp/under-restart.txt), not 200: $fails"
    eq "$(wc -l < /tmp/under-restart.txt)" 150
    eq "$fails" 0
    eq "$(sx keep 'echo after-activated-restart')" after-activated-restart
    # Back to the plain service (binds 127.0.0.1:8002 itself).
    systemctl stop sandboxd.socket sandboxd
    systemctl start sandboxd
    active sandboxd
    eq "$(sx keep 'echo plain-again')" plain-again
}

stop_with_sandboxes_running() {
    local pid t0 t1
    pid=$(state_pid keep)
    t0=$(date +%s%N)
    systemctl stop sandboxd
    t1=$(date +%s%N)
    echo "stop took $(( (t1 - t0) / 1000000 )) ms"
    must test $(( (t1 - t0) / 1000000 )) -lt 30000
    eq "$(systemctl show -p Result --value sandboxd)" success
    must test "$(systemctl is-active sandboxd)" = inactive
    must kill -0 "$pid"
    must grep -qx "$pid" $CG/sandboxd/keep/cgroup.procs
    systemctl start sandboxd
    eq "$(sx keep 'echo after-stop')" after-stop
    eq "$(state_pid keep)" "$pid"
}

delegated_parent_without_subgroup_is_refused() {
    # Sandboxes inside the unit's own delegated cgroup (Delegate=yes) make
    # it an inner node with controllers: systemd 252 then cannot start the
    # daemon in it again (status=219/CGROUP, "Failed to attach to cgroup
    # /system.slice/sandboxd.service: Device or resource busy", seen here
    # before the daemon refused it). The daemon refuses the layout at start
    # instead, saying why, and touches nothing: the running sandbox stays.
    local env=/etc/sandboxd/sandboxd.env pid t0
    pid=$(state_pid keep)
    echo 'SANDBOXD_CGROUP_PARENT=/system.slice/sandboxd.service/sandboxes' >> $env
    t0=$(date +%s)
    if systemctl restart sandboxd; then
        echo "ASSERTION FAILED: the daemon started with a parent inside its unit's cgroup" >&2
        return 1
    fi
    has "$(journal_since "$t0")" "DelegateSubgroup=daemon"
    must test ! -e $CG/system.slice/sandboxd.service/sandboxes
    must kill -0 "$pid"
    sed -i '/^SANDBOXD_CGROUP_PARENT=/d' $env
    systemctl reset-failed sandboxd
    systemctl start sandboxd
    active sandboxd
    eq "$(state_pid keep)" "$pid"
    eq "$(sx keep 'echo after-refusal')" after-refusal
}

create_p50() {
    local p50
    p50=$(bash "$T/create-p50.sh" "$URL" "$(token)" "$CREATE_N")
    echo "create p50 over $CREATE_N creates: $p50 ms"
    must test -n "$p50"
    figure guest_create_p50_ms "$p50"
}

purge_leaves_nothing() {
    local files f left="" pid
    # A sandbox still running when the package goes: its state goes with
    # the purge, so it must not outlive it.
    create leftover >/dev/null
    pid=$(state_pid leftover)
    must kill -0 "$pid"
    files=$(dpkg -L sandboxd | while read -r f; do [ -d "$f" ] || echo "$f"; done)
    dpkg -P sandboxd
    for f in $files /var/lib/sandboxd /etc/sandboxd /run/sandboxd $CG/sandboxd \
        /etc/systemd/system/multi-user.target.wants/sandboxd.service \
        /etc/systemd/system/sockets.target.wants/sandboxd.socket \
        /etc/systemd/system/sandboxd.service /etc/systemd/system/sandboxd.socket; do
        if [ -e "$f" ] || [ -L "$f" ]; then left="$left file:$f"; fi
    done
    kill -0 "$pid" 2>/dev/null && left="$left process:$pid"
    # (one name per pgrep: a pattern longer than 15 characters matches nothing)
    for n in sandboxd sandbox-init sandbox-agent; do
        for p in $(pgrep -x "$n" || true); do left="$left process:$n:$p"; done
    done
    nft list tables | grep -qw sandboxd && left="$left nft-table:sandboxd"
    for u in $(systemctl list-units --all --no-legend --plain 'sandboxd*' | awk '$3 != "inactive" || $2 != "not-found" {print $1}'); do
        left="$left unit:$u"
    done
    dpkg -s sandboxd >/dev/null 2>&1 && left="$left dpkg:sandboxd"
    echo "left behind: ${left:-nothing}"
    must test -z "$left"
}

integration_tests() {
    # The `it` test binary built on the host, with the binaries it runs
    # at the paths it was built with (on ext4: idmapped mounts need it).
    mkdir -p "$REPO/target/debug"
    tar -C "$REPO" -xf "$T/repo.tar"
    cp "$T/bin/sandboxd" "$T/bin/sandbox-init" "$T/bin/sandbox-agent" "$REPO/target/debug/"
    cp "$T/bin/it" /root/it
    cd "$REPO"
    # shellcheck disable=SC2086
    CI=true SANDBOXD_TEST_SLOT_BASE=$SLOT_BASE /root/it $IT_ARGS --test-threads=$IT_THREADS \
        > "$OUT/it.log" 2>&1 || true
    grep -E '^test .* \.\.\. ' "$OUT/it.log" > "$OUT/it-results.txt" || true
    must grep -q '^test result: ' "$OUT/it.log"
}

# ------------------------------------------------------------------ run

# `check` runs each function in a bash of its own: they all go there.
# shellcheck disable=SC2046
export -f $(declare -F | awk '{print $3}')

log "guest.sh: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1024 " MiB"}' /proc/meminfo)"
: > "$RES"
: > "$OUT/figures.txt"
figure runner_start_s "$(now)"
check host_is_pure_v2_under_systemd 30 host_is_pure_v2_under_systemd
check package_installs_enabled_not_started 120 package_installs_enabled_not_started
check start_is_ready_with_notify 120 start_is_ready_with_notify
check logs_reach_the_journal_as_fields 30 logs_reach_the_journal_as_fields
check api_create_exec_delete 120 api_create_exec_delete
check limits_memory_pids_cpu 180 limits_memory_pids_cpu
check device_allow_list_enforced 120 device_allow_list_enforced
check egress_policy_in_a_test_netns 120 egress_policy_in_a_test_netns
check user_namespace_and_idmapped_workspace 120 user_namespace_and_idmapped_workspace
check restart_keeps_sandboxes 120 restart_keeps_sandboxes
check watchdog_is_fed 120 watchdog_is_fed
check socket_activation 180 socket_activation
check stop_with_sandboxes_running 150 stop_with_sandboxes_running
check delegated_parent_without_subgroup_is_refused 180 delegated_parent_without_subgroup_is_refused
check create_p50 180 create_p50
check purge_leaves_nothing 120 purge_leaves_nothing
if [ "$RUN_IT" = 1 ]; then
    check integration_tests 600 integration_tests
else
    result "FAIL integration_tests: not run (VM_TIER_IT=0)"
fi
# Every integration test is a result of its own.
if [ -s "$OUT/it-results.txt" ]; then
    while read -r _ name _ outcome; do
        case "$outcome" in
            ok) result "PASS it::$name" ;;
            ignored) result "FAIL it::$name: ignored (the tier runs every selected test)" ;;
            *) result "FAIL it::$name: $outcome (out/it.log)" ;;
        esac
    done < "$OUT/it-results.txt"
fi
systemctl --failed --no-legend --plain > "$OUT/failed-units.txt" || true
journalctl -b --no-pager > "$OUT/journal.txt" 2>&1 || true
echo done > "$OUT/done"
result "DONE"
log "guest.sh: done"
