//! Create/delete benchmark (run with `bash bench/create.sh`, as root).
//!
//! In one run, for each network mode (`egress`, the default, and `none`):
//! create-to-ready latency (POST /api/sandboxes returns 200 with the agent
//! answering) of N native sandboxes through the real daemon, each create
//! followed by a `runc run` of the identical bundle timed until its agent
//! answers `GET /v1/sandbox` (interleaved, so both see the same load on a
//! shared machine), then the deletes. Writes the figures into
//! docs/performance.md between the CREATE markers (not with
//! `BENCH_NO_WRITE=1`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandboxd::backend::native::netns::{open_netns, NetnsDialer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "bench-token-0123456789abcdef0123456789abcdef";

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// Minimal HTTP/1.1 request over a fresh TCP connection; returns status.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap_or(0);
    (status, out)
}

struct Daemon {
    child: std::process::Child,
    addr: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// The bench's own nft table, link prefix and subnet, so that it never
/// meets another daemon's (or a test's) on the same host.
const NET_ENV: [(&str, &str); 3] = [
    ("SANDBOXD_NETWORK_TABLE", "sandboxd_bench"),
    ("SANDBOXD_NETWORK_LINK_PREFIX", "sbxbn-"),
    ("SANDBOXD_NETWORK_SUBNET", "10.252.0.0/16"),
];

/// A second daemon's (the warm-pool bench runs two side by side).
const NET_ENV_B: [(&str, &str); 3] = [
    ("SANDBOXD_NETWORK_TABLE", "sandboxd_bench_b"),
    ("SANDBOXD_NETWORK_LINK_PREFIX", "sbxbm-"),
    ("SANDBOXD_NETWORK_SUBNET", "10.253.0.0/16"),
];

/// `NET_ENV`'s value of `key`, or the bench's own environment's (so two
/// benches can run side by side with their own table, links and subnet).
fn net_env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| {
        NET_ENV
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
            .unwrap_or_default()
    })
}

/// The daemons' cgroup parent (`SANDBOXD_CGROUP_PARENT` overrides it).
fn cgroup_parent() -> String {
    std::env::var("SANDBOXD_CGROUP_PARENT").unwrap_or_else(|_| "sandboxd-bench".to_string())
}

/// A daemon of the default configuration but for its network mode and
/// no warm pool: the create figures are of cold starts.
fn start_daemon(root: &Path, network: &str) -> Daemon {
    start_daemon_with(
        root,
        network,
        network,
        &[("SANDBOXD_POOL_SIZE", "0")],
        &bench_net(),
        &cgroup_parent(),
    )
}

/// The bench's network settings (`NET_ENV`, or the environment's).
fn bench_net() -> Vec<(&'static str, String)> {
    NET_ENV.iter().map(|(k, _)| (*k, net_env(k))).collect()
}

fn start_daemon_with(
    root: &Path,
    name: &str,
    network: &str,
    extra: &[(&str, &str)],
    net: &[(&str, String)],
    cgroup_parent: &str,
) -> Daemon {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    // BENCH_SANDBOXD: another build of the daemon (with its sandbox-init
    // and agent next to it), to compare two builds with the same bench.
    let exe = std::env::var_os("BENCH_SANDBOXD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sandboxd")));
    let child = Command::new(exe)
        .args(["serve", "--listen", &addr, "--state-dir"])
        .arg(root.join(format!("state-{name}")))
        .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
        .env("PROVISIONER_BACKEND", "native")
        .env("SANDBOXD_USER_DATA_ROOT", root.join("ud"))
        .env("SANDBOXD_SKILLS_ROOT", root.join("sk"))
        .env("SANDBOXD_CGROUP_PARENT", cgroup_parent)
        .env("SANDBOXD_STOP_SANDBOXES_ON_EXIT", "true")
        .env("SANDBOXD_NETWORK", network)
        .envs(net.iter().map(|(k, v)| (*k, v.as_str())))
        .envs(extra.iter().copied())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child, addr };
    for _ in 0..600 {
        if std::net::TcpStream::connect(&daemon.addr).is_ok() {
            return daemon;
        }
        // A daemon that cannot start says why on stderr (inherited, above)
        // and exits: stop here rather than on the first refused request.
        // (A panic, not an exit: the daemons already started are stopped
        // by their drops.)
        if let Ok(Some(status)) = daemon.child.try_wait() {
            panic!("the daemon ({name}) exited with {status} before listening; its error is above");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the daemon ({name}) did not listen on {} within 30 s",
        daemon.addr
    )
}

/// Times `runtime run -d` of `bundle` until the agent answers, then
/// `runtime delete --force`.
fn time_runtime(
    runtime: &str,
    bundle: &Path,
    name: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<(f64, f64), String> {
    let root = bundle.parent().unwrap().join(format!("{runtime}-root"));
    let pidfile = bundle.parent().unwrap().join(format!("{name}.pid"));
    // The container inherits the runtime's stdio: point it at a file, or
    // waiting for the runtime's output would wait for the container.
    let log_path = bundle.parent().unwrap().join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let out = Command::new(runtime)
        .arg("--root")
        .arg(&root)
        .args(["run", "--detach", "--pid-file"])
        .arg(&pidfile)
        .arg("--bundle")
        .arg(bundle)
        .arg(name)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .status()
        .map_err(|e| format!("{runtime}: {e}"))?;
    let cleanup = || {
        let _ = Command::new(runtime)
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", name])
            .output();
    };
    if !out.success() {
        cleanup();
        return Err(format!(
            "{runtime} run failed: {}",
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .trim()
        ));
    }
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .map_err(|e| e.to_string())?
        .trim()
        .parse()
        .map_err(|_| "bad pid file".to_string())?;
    let ns = std::sync::Arc::new(open_netns(pid).map_err(|e| e.to_string())?);
    let dialer = NetnsDialer::start().map_err(|e| e.to_string())?;
    let answered = rt.block_on(async {
        loop {
            if started.elapsed() > Duration::from_secs(20) {
                return false;
            }
            if let Ok(mut s) = dialer
                .connect(ns.clone(), "127.0.0.1:8080".parse().unwrap())
                .await
            {
                let _ = s
                    .write_all(b"GET /v1/sandbox HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await;
                let mut buf = vec![0u8; 12];
                if s.read_exact(&mut buf).await.is_ok() && &buf[9..12] == b"200" {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    });
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    cleanup();
    let deleted = t.elapsed().as_secs_f64() * 1000.0;
    if answered {
        Ok((elapsed, deleted))
    } else {
        Err(format!("{runtime}: agent never answered"))
    }
}

/// p50 and p95 of `v`.
/// One create and delete (page cache, binaries).
fn warm_up(addr: &str) {
    let (s, out) = http(
        addr,
        "POST",
        "/api/sandboxes",
        r#"{"sandbox_id":"warm","thread_id":"t","uid":"bench"}"#,
    );
    assert_eq!(s, 200, "warm-up create failed: {out}");
    http(addr, "DELETE", "/api/sandboxes/warm", "");
}

fn p50_95(v: &mut [f64]) -> (f64, f64) {
    (pct(v, 0.5), pct(v, 0.95))
}

/// One run of a network mode: sandboxd creates interleaved with `runc run`
/// of the identical bundle (so both see the same machine load), then the
/// deletes. Returns the table rows.
fn run_mode(
    root: &Path,
    network: &str,
    n: usize,
    bundle: &Path,
    rt: &tokio::runtime::Runtime,
    runc: bool,
) -> Vec<String> {
    let d = start_daemon(root, network);
    warm_up(&d.addr);
    if runc {
        let _ = time_runtime("runc", bundle, &format!("bench-runc-{network}-warm"), rt);
    }
    // First the daemon alone: n creates back to back, then their deletes
    // (the absolute figure; the interleaved runs below give the ratio, but
    // each `runc delete` leaves the kernel work of tearing down a
    // container behind, which the next create meets).
    // One create through the API, timed (ms).
    let timed_create = |id: &str| {
        let body = format!(r#"{{"sandbox_id":"{id}","thread_id":"t","uid":"bench"}}"#);
        let t = Instant::now();
        let (s, out) = http(&d.addr, "POST", "/api/sandboxes", &body);
        assert_eq!(s, 200, "{out}");
        t.elapsed().as_secs_f64() * 1000.0
    };
    let mut alone: Vec<f64> = (0..n).map(|i| timed_create(&format!("a{i}"))).collect();
    for i in 0..n {
        let (s, _) = http(&d.addr, "DELETE", &format!("/api/sandboxes/a{i}"), "");
        assert_eq!(s, 200);
    }
    let (a50, a95) = p50_95(&mut alone);
    println!("[{network}] sandboxd create-to-ready alone: p50 {a50:.1} ms p95 {a95:.1} ms (n={n})");
    let (mut create, mut delete, mut rc, mut rd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut runc_err = None;
    for i in 0..n {
        create.push(timed_create(&format!("b{i}")));
        if runc && runc_err.is_none() {
            match time_runtime("runc", bundle, &format!("bench-runc-{network}-{i}"), rt) {
                Ok((c, del)) => {
                    rc.push(c);
                    rd.push(del);
                }
                Err(e) => runc_err = Some(e),
            }
        }
    }
    for i in 0..n {
        let t = Instant::now();
        let (s, _) = http(&d.addr, "DELETE", &format!("/api/sandboxes/b{i}"), "");
        assert_eq!(s, 200);
        delete.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    drop(d);
    let ((c50, c95), (d50, d95)) = (p50_95(&mut create), p50_95(&mut delete));
    println!("[{network}] sandboxd create-to-ready: p50 {c50:.1} ms p95 {c95:.1} ms; delete p50 {d50:.1} ms p95 {d95:.1} ms (n={n})");
    let mut rows = vec![
        format!(
            "| `{network}` | sandboxd create-to-ready alone ({n} creates back to back, no `runc` between them) | {a50:.1} | {a95:.1} | |"
        ),
        format!(
            "| `{network}` | sandboxd create-to-ready, interleaved with `runc run` (POST until 200, agent answering) | {c50:.1} | {c95:.1} | {d50:.1} / {d95:.1} |"
        ),
    ];
    if !runc {
        return rows;
    }
    match runc_err {
        None => {
            let ((r50, r95), (q50, q95)) = (p50_95(&mut rc), p50_95(&mut rd));
            println!("[{network}] runc run: p50 {r50:.1} ms p95 {r95:.1} ms; delete p50 {q50:.1} ms (n={}); sandboxd/runc p50 {:.2}", rc.len(), c50 / r50);
            rows.push(format!(
                "| `{network}` | `runc run` of the same bundle, interleaved ({} runs; no network set up) | {r50:.1} | {r95:.1} | {q50:.1} / {q95:.1} |",
                rc.len()
            ));
            rows.push(format!(
                "| `{network}` | **sandboxd / runc, p50** | **{:.2}** | | {:.2} |",
                c50 / r50,
                d50 / q50
            ));
        }
        Some(e) => {
            println!("[{network}] runc: {e}");
            rows.push(format!(
                "| `{network}` | `runc run` | failed: {} | | |",
                e.replace('|', "/").chars().take(120).collect::<String>()
            ));
        }
    }
    rows
}

/// Latencies (ms) and statuses of `reqs` sent all at once, one thread
/// each; and the wall time of the whole batch.
fn batch(addr: &str, reqs: Vec<(&'static str, String, String)>) -> (Vec<f64>, Vec<u16>, f64) {
    let start = Instant::now();
    let handles: Vec<_> = reqs
        .into_iter()
        .map(|(method, path, body)| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let t = Instant::now();
                let (s, _) = http(&addr, method, &path, &body);
                (t.elapsed().as_secs_f64() * 1000.0, s)
            })
        })
        .collect();
    let (lat, st): (Vec<f64>, Vec<u16>) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
    (lat, st, start.elapsed().as_secs_f64() * 1000.0)
}

/// N creates then N deletes, one after another, then N concurrent creates
/// and N concurrent deletes, against one daemon (default config): total
/// time, p50 and p95 per request, errors. Returns the table rows.
fn run_concurrency(root: &Path, n: usize) -> Vec<String> {
    let d = start_daemon(root, "egress");
    let (s, out) = http(
        &d.addr,
        "POST",
        "/api/sandboxes",
        r#"{"sandbox_id":"warm","thread_id":"t","uid":"bench"}"#,
    );
    assert_eq!(s, 200, "warm-up create failed: {out}");
    http(&d.addr, "DELETE", "/api/sandboxes/warm", "");
    let create = |p: &str, i: usize| {
        (
            "POST",
            "/api/sandboxes".to_string(),
            format!(r#"{{"sandbox_id":"{p}{i}","thread_id":"t","uid":"bench{i}"}}"#),
        )
    };
    let delete = |p: &str, i: usize| ("DELETE", format!("/api/sandboxes/{p}{i}"), String::new());
    let mut rows = Vec::new();
    let mut row = |what: &str, lat: &mut Vec<f64>, st: &[u16], total: f64| {
        let errors = st.iter().filter(|s| **s != 200).count();
        let (p50, p95) = p50_95(lat);
        println!("[concurrency] {what}: total {total:.0} ms, p50 {p50:.1} ms, p95 {p95:.1} ms, errors {errors}/{n}");
        rows.push(format!(
            "| {what} | {total:.0} | {p50:.1} | {p95:.1} | {errors} |"
        ));
    };
    // One after another.
    for (kind, p) in [("create", "s"), ("delete", "s")] {
        let (mut lat, mut st) = (Vec::new(), Vec::new());
        let start = Instant::now();
        for i in 0..n {
            let (m, path, body) = if kind == "create" {
                create(p, i)
            } else {
                delete(p, i)
            };
            let t = Instant::now();
            st.push(http(&d.addr, m, &path, &body).0);
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let total = start.elapsed().as_secs_f64() * 1000.0;
        row(&format!("{n} {kind}s, sequential"), &mut lat, &st, total);
    }
    // All at once.
    let (mut lat, st, total) = batch(&d.addr, (0..n).map(|i| create("c", i)).collect());
    row(&format!("{n} creates, concurrent"), &mut lat, &st, total);
    let (mut lat, st, total) = batch(&d.addr, (0..n).map(|i| delete("c", i)).collect());
    row(&format!("{n} deletes, concurrent"), &mut lat, &st, total);
    drop(d);
    rows
}

/// `VmRSS` of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of `pid` in clock ticks (every thread, children not).
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat; `rest` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// p50 (ms) of `k` requests.
/// Requests per list or discover figure (each on a fresh connection).
const SAMPLES: usize = 50;

fn timed(addr: &str, method: &str, path: &str, k: usize) -> f64 {
    let mut v: Vec<f64> = (0..k)
        .map(|_| {
            let t = Instant::now();
            let (s, _) = http(addr, method, path, "");
            assert_eq!(s, 200, "{method} {path}");
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    pct(&mut v, 0.5)
}

/// `n` idle sandboxes on one daemon (default config): create latency at 1
/// and at `n` live, list and discover latency at 1 and `n` live, daemon and
/// agent memory, CPU of the idle sandboxes (and the daemon) over `idle`,
/// and the time to delete them all. Returns the table rows.
fn run_density(root: &Path, n: usize, idle: Duration) -> Vec<String> {
    let d = start_daemon(root, "egress");
    let daemon_pid = d.child.id();
    let create = |i: usize| {
        let body = format!(
            r#"{{"sandbox_id":"d{i}","thread_id":"t","uid":"bench{}"}}"#,
            i % 50
        );
        let t = Instant::now();
        let (s, out) = http(&d.addr, "POST", "/api/sandboxes", &body);
        assert_eq!(s, 200, "create d{i}: {out}");
        t.elapsed().as_secs_f64() * 1000.0
    };
    let mut rows = Vec::new();
    let mut first = vec![create(0)];
    let list1 = timed(&d.addr, "GET", "/api/sandboxes", SAMPLES);
    let disc1 = timed(&d.addr, "GET", "/api/sandboxes/d0", SAMPLES);
    let rss1 = rss_kib(daemon_pid);
    first.extend((1..10.min(n)).map(create));
    let started = Instant::now();
    let mut last = Vec::new();
    for i in 10..n {
        let ms = create(i);
        if i + 10 >= n {
            last.push(ms);
        }
        if i % 100 == 0 {
            println!(
                "[density] {i} live, {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    let (c1, cn) = (pct(&mut first, 0.5), pct(&mut last, 0.5));
    println!(
        "[density] create p50 with 1–10 live {c1:.1} ms, with {}–{n} live {cn:.1} ms",
        n - 10
    );
    let listn = timed(&d.addr, "GET", "/api/sandboxes", SAMPLES);
    let discn = timed(
        &d.addr,
        "GET",
        &format!("/api/sandboxes/d{}", n / 2),
        SAMPLES,
    );
    let per_record_us = (listn - list1) * 1000.0 / (n - 1).max(1) as f64;
    // What serializing the same records costs by itself: the list's body,
    // parsed, serialized again by serde_json in this process.
    let (s, out) = http(&d.addr, "GET", "/api/sandboxes", "");
    assert_eq!(s, 200, "list: {out}");
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let listed: serde_json::Value = serde_json::from_str(body).expect("list body");
    assert_eq!(listed["count"], n, "every sandbox listed");
    let mut ser: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let t = Instant::now();
            let v = serde_json::to_vec(&listed).unwrap();
            assert!(v.len() > n);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let ser_us = pct(&mut ser, 0.5) / n as f64;
    println!(
        "[density] list {list1:.3} → {listn:.3} ms ({per_record_us:.2} µs per record; {} bytes; serde_json {ser_us:.2} µs per record), discover {disc1:.3} → {discn:.3} ms",
        body.len()
    );
    // The agents: PID 1 of each sandbox, from the state directory.
    let state = root.join("state-egress").join("sandboxes");
    let agents: Vec<u32> = (0..n)
        .filter_map(|i| {
            let b = std::fs::read(state.join(format!("d{i}")).join("state.json")).ok()?;
            let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
            v["pid"].as_u64().map(|p| p as u32)
        })
        .collect();
    assert_eq!(agents.len(), n, "PID 1 of every sandbox");
    let mut agent_rss: Vec<f64> = agents.iter().map(|p| rss_kib(*p) as f64).collect();
    let rssn = rss_kib(daemon_pid);
    let ticks = |pids: &[u32]| pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let (a0, d0) = (ticks(&agents), cpu_ticks(daemon_pid));
    std::thread::sleep(idle);
    let (a1, d1) = (ticks(&agents), cpu_ticks(daemon_pid));
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let agent_cpu_ms = (a1 - a0) as f64 * 1000.0 / hz;
    let daemon_cpu_ms = (d1 - d0) as f64 * 1000.0 / hz;
    // Delete them all, 8 at a time.
    let t = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..8 {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    break;
                }
                let (s, _) = http(&d.addr, "DELETE", &format!("/api/sandboxes/d{i}"), "");
                assert_eq!(s, 200, "delete d{i}");
            });
        }
    });
    let deleted_s = t.elapsed().as_secs_f64();
    drop(d);
    let (ar50, armax) = (pct(&mut agent_rss, 0.5), pct(&mut agent_rss, 1.0));
    let idle_s = idle.as_secs();
    for (what, v) in [
        (
            format!("create p50, 1–10 live → {}–{n} live (ms)", n - 10),
            format!("{c1:.1} → {cn:.1} ({:.2}×)", cn / c1),
        ),
        (
            format!("list p50, 1 → {n} live (ms)"),
            format!("{list1:.3} → {listn:.3}"),
        ),
        (
            format!(
                "list cost per live sandbox: (p50 at {n} − p50 at 1) / {} (µs)",
                n - 1
            ),
            format!(
                "{per_record_us:.2} (body {:.0} KiB; serde_json alone, same records: {ser_us:.2})",
                body.len() as f64 / 1024.0
            ),
        ),
        (
            format!("discover p50, 1 → {n} live (ms)"),
            format!("{disc1:.3} → {discn:.3}"),
        ),
        (
            format!("daemon RSS, 1 → {n} live (MiB)"),
            format!("{:.1} → {:.1}", rss1 as f64 / 1024.0, rssn as f64 / 1024.0),
        ),
        (
            "agent RSS p50 / max (MiB)".to_string(),
            format!("{:.2} / {:.2}", ar50 / 1024.0, armax / 1024.0),
        ),
        (
            format!("CPU of all {n} idle agents over {idle_s} s (ms)"),
            format!("{agent_cpu_ms:.0}"),
        ),
        (
            format!("CPU of the daemon over the same {idle_s} s (ms)"),
            format!("{daemon_cpu_ms:.0}"),
        ),
        (
            format!("delete all {n} (8 at a time, s)"),
            format!("{deleted_s:.1}"),
        ),
    ] {
        println!("[density] {what}: {v}");
        rows.push(format!("| {what} | {v} |"));
    }
    rows
}

/// `sandboxd_pool_ready` of the daemon at `addr`.
fn pool_ready(addr: &str) -> i64 {
    let (_, out) = http(addr, "GET", "/metrics", "");
    out.lines()
        .find_map(|l| l.strip_prefix("sandboxd_pool_ready "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn wait_pool_ready(addr: &str, n: i64) {
    let end = Instant::now() + Duration::from_secs(60);
    while pool_ready(addr) < n {
        assert!(
            Instant::now() < end,
            "the pool did not refill to {n} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The warm pool against cold starts: two daemons side by side (default
/// configuration, egress), one with `[pool] size = 2`, one without; each
/// round waits until the pool is full again, times a create on the pool
/// daemon (a claim), waits again, and times a create on the other (a cold
/// start), so neither is timed while the pool refills.
fn run_pool(root: &Path, n: usize) -> Vec<String> {
    let pool = start_daemon_with(
        root,
        "pool",
        "egress",
        &[("SANDBOXD_POOL_SIZE", "2")],
        &bench_net(),
        &cgroup_parent(),
    );
    let cold = start_daemon_with(
        root,
        "cold",
        "egress",
        &[("SANDBOXD_POOL_SIZE", "0")],
        &NET_ENV_B
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect::<Vec<_>>(),
        &format!("{}-b", cgroup_parent()),
    );
    for d in [&pool, &cold] {
        warm_up(&d.addr);
    }
    let (mut claim, mut coldv, mut del_claimed) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let body = format!(
            r#"{{"sandbox_id":"p{i}","thread_id":"t","uid":"bench{}"}}"#,
            i % 10
        );
        wait_pool_ready(&pool.addr, 2);
        let t = Instant::now();
        let (s, out) = http(&pool.addr, "POST", "/api/sandboxes", &body);
        assert_eq!(s, 200, "{out}");
        claim.push(t.elapsed().as_secs_f64() * 1000.0);
        wait_pool_ready(&pool.addr, 2);
        let t = Instant::now();
        let (s, out) = http(&cold.addr, "POST", "/api/sandboxes", &body);
        assert_eq!(s, 200, "{out}");
        coldv.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (_, metrics) = http(&pool.addr, "GET", "/metrics", "");
    let claimed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_pool_claims{result=\"claimed\"} "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    for i in 0..n {
        let t = Instant::now();
        let (s, _) = http(&pool.addr, "DELETE", &format!("/api/sandboxes/p{i}"), "");
        assert_eq!(s, 200);
        del_claimed.push(t.elapsed().as_secs_f64() * 1000.0);
        http(&cold.addr, "DELETE", &format!("/api/sandboxes/p{i}"), "");
    }
    drop(pool);
    drop(cold);
    let ((c50, c95), (k50, k95), (d50, d95)) = (
        p50_95(&mut claim),
        p50_95(&mut coldv),
        p50_95(&mut del_claimed),
    );
    println!("[pool] claim-to-ready p50 {c50:.1} ms p95 {c95:.1} ms ({claimed} of {} claimed); cold p50 {k50:.1} ms p95 {k95:.1} ms; delete of a claimed sandbox p50 {d50:.1} ms", n + 1);
    vec![
        format!("| claim-to-ready (POST until 200, a pool member claimed) | {c50:.1} | {c95:.1} |"),
        format!("| cold create-to-ready, same run (`[pool] size = 0`) | {k50:.1} | {k95:.1} |"),
        format!("| **claim / cold, p50** | **{:.2}** | |", c50 / k50),
        format!("| delete of a claimed sandbox | {d50:.1} | {d95:.1} |"),
        format!(
            "| creates served by the pool (of {}, with the warm-up) | {claimed} | |",
            n + 1
        ),
    ]
}

/// Replaces the text between `<!-- {name}:BEGIN` and `<!-- {name}:END -->`
/// in docs/performance.md (unless `BENCH_NO_WRITE` is set).
fn write_section(name: &str, section: &str) {
    if std::env::var_os("BENCH_NO_WRITE").is_some() {
        return;
    }
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/performance.md");
    let text = std::fs::read_to_string(&doc).unwrap_or_default();
    let (begin, end) = (format!("<!-- {name}:BEGIN"), format!("<!-- {name}:END -->"));
    let (Some(a), Some(b)) = (text.find(&begin), text.find(&end)) else {
        eprintln!("docs/performance.md lacks the {name} markers");
        std::process::exit(1);
    };
    let new = format!("{}{}{}", &text[..a], section, &text[b + end.len()..]);
    std::fs::write(&doc, new).unwrap();
    println!("wrote the {name} section of {}", doc.display());
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench/create needs root");
        std::process::exit(1);
    }
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // The bundle runc runs: what the daemon would launch for the same
    // request.
    let cfg = root.join("bundle.toml");
    std::fs::write(
        &cfg,
        format!(
            "user_data_root = \"{}\"\nskills_root = \"{}\"\n",
            root.join("ud").display(),
            root.join("sk").display()
        ),
    )
    .unwrap();
    let bundle: PathBuf = root.join("bundle");
    let st = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["bundle", "--sandbox-id", "rb", "--uid", "bench", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "create" {
        run_create(root, n, &bundle, &rt);
    }
    if only.is_empty() || only == "pool" {
        let rows = run_pool(root, n);
        let section = format!(
            "<!-- POOL:BEGIN (written by bench/create.sh) -->\n\
Measured {} on {} cores ({}), release build, `BENCH_ONLY=pool bash bench/create.sh` (BENCH_N={n}): two daemons\n\
side by side with the default configuration (egress networking), one with `[pool] size = 2`, one with the pool off;\n\
{n} rounds of: wait until the pool is full, create on the pool daemon (timed), wait until it is full again, create on\n\
the other (timed); persistent sandboxes of 10 users.\n\n\
| what | p50 ms | p95 ms |\n|---|---|---|\n{}\n\n\
Goal: claim-to-ready p50 ≤ 5 ms through the API.\n<!-- POOL:END -->",
            chrono_date(),
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            rows.join("\n")
        );
        write_section("POOL", &section);
    }
    if only == "density" {
        let n: usize = std::env::var("BENCH_DENSITY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500);
        let idle: u64 = std::env::var("BENCH_IDLE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        let rows = run_density(root, n, Duration::from_secs(idle));
        let section = format!(
            "<!-- DENSITY:BEGIN (written by bench/density.sh) -->\n\
Measured {} on {} cores ({}, {} GiB), release build, `bash bench/density.sh` (BENCH_DENSITY={n},\n\
BENCH_IDLE_SECONDS={idle}): one daemon with the default configuration (egress networking, default limits); {n}\n\
sandboxes created one after another (50 users), left idle, then deleted 8 at a time. List and discover: p50 of {SAMPLES}\n\
requests, each on a fresh connection.\n\n\
| what | value |\n|---|---|\n{}\n\n\
Goals: daemon RSS ≤ 50 MiB, agent RSS ≤ 5 MiB each, no CPU used by idle sandboxes, create p50 at {n} live ≤ 1.5 × at\n\
1 live, list/discover flat (discover the same at {n} live as at 1; list's cost per live sandbox near what\n\
serializing its record costs), all deleted within 60 s.\n<!-- DENSITY:END -->",
            chrono_date(),
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|m| m.lines().next()?.split_whitespace().nth(1)?.parse::<u64>().ok())
                .map(|k| k / (1024 * 1024))
                .unwrap_or(0),
            rows.join("\n")
        );
        write_section("DENSITY", &section);
    }
    if only.is_empty() || only == "concurrency" {
        let c: usize = std::env::var("BENCH_CONCURRENCY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        let rows = run_concurrency(root, c);
        let section = format!(
            "<!-- CONCURRENCY:BEGIN (written by bench/create.sh) -->\n\
Measured {} on {} cores ({}), release build, `BENCH_ONLY=concurrency bash bench/create.sh` (BENCH_CONCURRENCY={c}):\n\
one daemon with the default configuration (egress networking); {c} creates (distinct ids and users) then {c}\n\
deletes one after another, then {c} creates sent at once (one connection each) and {c} deletes sent at once.\n\n\
| what | total ms | p50 ms | p95 ms | errors |\n|---|---|---|---|---|\n{}\n\n\
Goal: no errors; concurrent total well under sequential total.\n<!-- CONCURRENCY:END -->",
            chrono_date(),
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            rows.join("\n")
        );
        write_section("CONCURRENCY", &section);
    }
    // The daemon leaves its nft table (a restart rebuilds it): the bench's
    // goes.
    for table in [net_env(NET_ENV[0].0), NET_ENV_B[0].1.to_string()] {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &table])
            .output();
    }
    // The daemon removed its sandboxes' cgroups; the parent goes too.
    for c in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_dir(c.path().join(cgroup_parent()));
        let _ = std::fs::remove_dir(c.path().join(format!("{}-b", cgroup_parent())));
    }
}

/// Both network modes against `runc run`; writes the CREATE section.
fn run_create(root: &Path, n: usize, bundle: &Path, rt: &tokio::runtime::Runtime) {
    let runc = Command::new("runc").arg("--version").output().is_ok();
    let mut rows = Vec::new();
    for network in ["egress", "none"] {
        rows.extend(run_mode(root, network, n, bundle, rt, runc));
    }
    if !runc {
        rows.push("| | `runc run` | not installed | | |".into());
    }
    let section = format!(
        "<!-- CREATE:BEGIN (written by bench/create.sh) -->\n\
Measured {} on {} cores ({}), release build, `bash bench/create.sh` (BENCH_N={n}): per network mode one daemon with the\n\
default configuration (its own nft table and subnet); first {n} sandboxes created one after another through the API\n\
and deleted (\"alone\"), then {n} more created one after another, each\n\
followed by a `runc run --detach` of the identical bundle (timed until its agent answers `GET /v1/sandbox` in the\n\
container's netns, then `runc delete --force`, timed), then the {n} sandboxes deleted through the API.\n\n\
| network | what | p50 ms | p95 ms | delete p50 / p95 ms |\n|---|---|---|---|---|\n{}\n\n\
Goal: p50 create-to-ready ≤ 1.0 × `runc run` p50 in the same run (interleaved), then ≤ 10 ms (alone).\n<!-- CREATE:END -->",
        chrono_date(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        rows.join("\n")
    );
    write_section("CREATE", &section);
}

fn chrono_date() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%d"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
