"""Driver of bench/idle.sh (see there): talks to the daemon it started and
prints one result line per figure."""
import ctypes
import http.client
import json
import os
import statistics
import time

TOKEN = os.environ["BENCH_TOKEN"]
SWAP = os.environ["BENCH_SWAP"]
PARENT = os.environ["BENCH_PARENT"]
DENSITY = int(os.environ.get("BENCH_DENSITY", "200"))
SAMPLES = int(os.environ.get("BENCH_SAMPLES", "20"))
DENSITY_SWAP = os.environ.get("BENCH_DENSITY_SWAP", "lz4")
PREFETCH_ROUNDS = int(os.environ.get("BENCH_PREFETCH_ROUNDS", "5"))
HOST, PORT = "127.0.0.1", 18736
MIB = 1 << 20

HOLDER = r'''
import hashlib, os, socket, sys, time
mib = int(sys.argv[1])
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
base = rss()
data = []
while rss() - base < mib * 1024 * 1024:
    data.extend({'id': i, 'name': os.urandom(24).hex(), 'score': i * 0.5, 'tags': ['a', 'b']}
                for i in range(len(data), len(data) + 10000))
def digest():
    t = time.monotonic()
    h = hashlib.sha256()
    for d in data:
        h.update(d['name'].encode()); h.update(str(d['score']).encode())
    return h.hexdigest(), time.monotonic() - t
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 9000)); s.listen(8)
d, secs = digest()
open('/tmp/ready', 'w').write(f'{d} {secs}')
while True:
    c, _ = s.accept()
    d, secs = digest()
    c.sendall(f'{d} {secs}'.encode()); c.close()
'''

ASK = ("python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 9000)); "
       "print(s.recv(200).decode())\"")


def api(method, path, body=None):
    c = http.client.HTTPConnection(HOST, PORT, timeout=300)
    h = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data) if data else None
    except ValueError:
        return r.status, data.decode(errors="replace")


def exec_(sid, cmd):
    s, v = api("POST", f"/api/sandboxes/{sid}/proxy/v1/shell/exec", {"command": cmd, "timeout": 120})
    assert s == 200, (s, v)
    return v["data"]["output"]


def ttfb_echo(sid, conn):
    """Milliseconds from sending an `echo` exec to the response head (the
    agent's first byte), on a kept-alive connection."""
    h = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = json.dumps({"command": "echo x"})
    t = time.perf_counter()
    conn.request("POST", f"/api/sandboxes/{sid}/proxy/v1/shell/exec", body=body, headers=h)
    r = conn.getresponse()
    ms = (time.perf_counter() - t) * 1000
    r.read()
    assert r.status == 200, r.status
    return ms


def idle_state(sid):
    _, v = api("GET", "/api/sandboxes")
    for sb in v["sandboxes"]:
        if sb["sandbox_id"] == sid:
            return sb["idle"]["state"]
    raise KeyError(sid)


def wait_state(sid, state, timeout=120):
    end = time.time() + timeout
    while True:
        if idle_state(sid) == state:
            return
        if time.time() > end:
            raise TimeoutError(f"{sid} never {state}")
        time.sleep(0.02)


def cgroup_dir(sid, controller):
    for p in (f"/sys/fs/cgroup/{controller}/{PARENT}/{sid}", f"/sys/fs/cgroup/{PARENT}/{sid}"):
        if os.path.isdir(p):
            return p
    raise FileNotFoundError(sid)


def cg_usage(sid):
    d = cgroup_dir(sid, "memory")
    for f in ("memory.usage_in_bytes", "memory.current"):
        if os.path.exists(f"{d}/{f}"):
            return int(open(f"{d}/{f}").read())
    raise FileNotFoundError(sid)


def swap_memory():
    """The swap device's own memory and the data it holds: zram's
    mem_used_total and orig_data_size; a disk swap holds its pages on the
    disk (0 of memory) and SwapTotal - SwapFree of data."""
    if SWAP != "disk":
        f = open("/sys/block/zram0/mm_stat").read().split()
        return int(f[2]), int(f[0])
    kib = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/meminfo")}
    return 0, (kib["SwapTotal"] - kib["SwapFree"]) * 1024


def metric(series):
    c = http.client.HTTPConnection(HOST, PORT)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def start_holder(sid, mib):
    exec_(sid, "cat > /tmp/hold.py <<'PYEOF'\n" + HOLDER + "PYEOF\n")
    out = exec_(sid, f"nohup python3 /tmp/hold.py {mib} >/tmp/h.log 2>&1 & "
                "for i in $(seq 1200); do [ -s /tmp/ready ] && break; sleep 0.1; done; cat /tmp/ready")
    digest, secs = out.split()
    return digest, float(secs)


def holder_pid(sid):
    """The holder's host PID (the sandbox's process running hold.py)."""
    for pid in open(f"{cgroup_dir(sid, 'memory')}/cgroup.procs").read().split():
        try:
            if b"hold.py" in open(f"/proc/{pid}/cmdline", "rb").read():
                return int(pid)
        except OSError:
            pass
    raise LookupError("no holder")


LIBC = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE, MADV_WILLNEED = 434, 440, 3


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def prefetch(pid):
    """What a prefetch by the daemon would do after a wake from reclaimed:
    process_madvise(MADV_WILLNEED) over the process's private writable
    anonymous mappings, which reads its swapped-out pages back into the
    swap cache ahead of use. Returns the seconds it took."""
    ranges = []
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        if f[1].startswith("rw") and f[1].endswith("p") and (len(f) < 6 or f[5] == "[heap]"):
            ranges.append((lo, hi - lo))
    fd = LIBC.syscall(SYS_PIDFD_OPEN, pid, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    t = time.perf_counter()
    for i in range(0, len(ranges), 512):
        chunk = ranges[i:i + 512]
        vec = (IoVec * len(chunk))(*[IoVec(b, n) for b, n in chunk])
        if LIBC.syscall(SYS_PROCESS_MADVISE, fd, vec, len(chunk), MADV_WILLNEED, 0) < 0:
            raise OSError(ctypes.get_errno(), "process_madvise")
    secs = time.perf_counter() - t
    os.close(fd)
    return secs


def create(sid):
    s, v = api("POST", "/api/sandboxes", {"sandbox_id": sid, "thread_id": sid, "uid": "bench",
                                          "inherit_env": False})
    assert s == 200, (s, v)


def line(what, value):
    print(f"{SWAP}\t{what}\t{value}", flush=True)


def one_sandbox():
    sid = "py"
    create(sid)
    digest, touch_active = start_holder(sid, 100)
    active = cg_usage(sid)
    z0, _ = swap_memory()
    wait_state(sid, "frozen")
    frozen = cg_usage(sid)
    wait_state(sid, "reclaimed")
    time.sleep(0.5)
    reclaimed = cg_usage(sid)
    z1, held = swap_memory()
    swapmem = z1 - z0
    line("cgroup active MiB", f"{active / MIB:.1f}")
    line("cgroup frozen MiB", f"{frozen / MIB:.1f}")
    line("cgroup reclaimed MiB", f"{reclaimed / MIB:.1f} ({100 * reclaimed / active:.0f} % of active)")
    line("swap device's memory MiB (holds MiB)", f"{swapmem / MIB:.1f} ({held / MIB:.1f})")
    line("host reclaimed (cgroup + swap memory) % of active", f"{100 * (reclaimed + swapmem) / active:.0f}")
    # After the wake: the same heap, and the time to touch all of it.
    out = exec_(sid, ASK).split()
    line("heap checksum equal after wake from reclaimed", out[0] == digest)
    # Touching the whole heap after a wake from reclaimed, without and
    # with a prefetch (the wake itself by an `echo`, then the heap).
    plain, pre, pre_secs = [], [], []
    for _ in range(PREFETCH_ROUNDS):
        wait_state(sid, "reclaimed")
        exec_(sid, "echo")
        plain.append(float(exec_(sid, ASK).split()[1]))
        wait_state(sid, "reclaimed")
        exec_(sid, "echo")
        pre_secs.append(prefetch(holder_pid(sid)))
        pre.append(float(exec_(sid, ASK).split()[1]))
    med = statistics.median
    line("touch 100 MiB heap s: active / after reclaim", f"{touch_active:.3f} / {med(plain):.3f}")
    line("after reclaim with a prefetch s: prefetch + touch",
         f"{med(pre_secs):.3f} + {med(pre):.3f} = {med(pre_secs) + med(pre):.3f}")
    # Wake latency: active, from frozen, from reclaimed.
    conn = http.client.HTTPConnection(HOST, PORT, timeout=120)
    # Active: each request after a pause as long as the ladder allows
    # without a freeze (0.8 s; freeze after 1 s), so both sides start
    # from an idle machine.
    act = []
    for _ in range(SAMPLES):
        time.sleep(0.8)
        act.append(ttfb_echo(sid, conn))
    fr = []
    for _ in range(SAMPLES):
        wait_state(sid, "frozen")
        fr.append(ttfb_echo(sid, conn))
    rc = []
    for _ in range(SAMPLES):
        wait_state(sid, "reclaimed")
        rc.append(ttfb_echo(sid, conn))
    conn.close()
    f = lambda xs: f"p50 {statistics.median(xs):.2f} p99 {pct(xs, 99):.2f}"
    line("echo exec ms, active", f(act))
    line("echo exec ms, from frozen", f(fr) + f" (+{statistics.median(fr) - statistics.median(act):.2f} p50)")
    line("echo exec ms, from reclaimed", f(rc) + f" (+{statistics.median(rc) - statistics.median(act):.2f} p50)")
    for frm in ("frozen", "reclaimed"):
        total = metric('sandboxd_wake_duration_seconds_sum{from="%s"}' % frm)
        count = metric('sandboxd_wake_duration_seconds_count{from="%s"}' % frm)
        line(f"thaw ms mean in the daemon, from {frm}", f"{1000 * total / max(1, count):.2f} ({count:.0f} wakes)")
    s, _ = api("DELETE", f"/api/sandboxes/{sid}")
    assert s == 200


def density():
    ids = []
    batch = 10
    for i in range(DENSITY):
        sid = f"d{i}"
        create(sid)
        start_holder(sid, 50)
        ids.append(sid)
        if len(ids) % batch == 0 or i == DENSITY - 1:
            for b in ids[-batch:]:
                wait_state(b, "reclaimed", timeout=600)
    time.sleep(2)
    total = sum(cg_usage(s) for s in ids)
    z, _ = swap_memory()
    per = (total + z) / len(ids)
    line(f"density: {len(ids)} reclaimed REPLs of 50 MiB, cgroups + swap memory MiB", f"{total / MIB:.0f} + {z / MIB:.0f}")
    line("density: host MiB per reclaimed sandbox", f"{per / MIB:.1f}")
    line("density: reclaimed sandboxes a 24 GiB node holds (extrapolated)", f"{int(24 * 1024 * MIB / per)}")


one_sandbox()
if SWAP == DENSITY_SWAP and DENSITY > 0:
    density()
