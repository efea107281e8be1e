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

fn start_daemon(root: &Path, network: &str) -> Daemon {
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
        .arg(root.join(format!("state-{network}")))
        .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
        .env("PROVISIONER_BACKEND", "native")
        .env("SANDBOXD_USER_DATA_ROOT", root.join("ud"))
        .env("SANDBOXD_SKILLS_ROOT", root.join("sk"))
        .env("SANDBOXD_CGROUP_PARENT", "sandboxd-bench")
        .env("SANDBOXD_STOP_SANDBOXES_ON_EXIT", "true")
        .env("SANDBOXD_NETWORK", network)
        .envs(NET_ENV)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Daemon { child, addr }
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
    // Warm-up (page cache, binaries).
    let (s, out) = http(
        &d.addr,
        "POST",
        "/api/sandboxes",
        r#"{"sandbox_id":"warm","thread_id":"t","uid":"bench"}"#,
    );
    assert_eq!(s, 200, "warm-up create failed: {out}");
    http(&d.addr, "DELETE", "/api/sandboxes/warm", "");
    if runc {
        let _ = time_runtime("runc", bundle, &format!("bench-runc-{network}-warm"), rt);
    }
    let (mut create, mut delete, mut rc, mut rd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut runc_err = None;
    for i in 0..n {
        let body = format!(r#"{{"sandbox_id":"b{i}","thread_id":"t","uid":"bench"}}"#);
        let t = Instant::now();
        let (s, out) = http(&d.addr, "POST", "/api/sandboxes", &body);
        assert_eq!(s, 200, "{out}");
        create.push(t.elapsed().as_secs_f64() * 1000.0);
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
    let mut rows = vec![format!(
        "| `{network}` | sandboxd create-to-ready (POST until 200, agent answering) | {c50:.1} | {c95:.1} | {d50:.1} / {d95:.1} |"
    )];
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
    // The daemon removed its sandboxes' cgroups; the parent goes too.
    for c in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_dir(c.path().join("sandboxd-bench"));
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
default configuration (its own nft table and subnet); {n} sandboxes created one after another through the API, each\n\
followed by a `runc run --detach` of the identical bundle (timed until its agent answers `GET /v1/sandbox` in the\n\
container's netns, then `runc delete --force`, timed), then the {n} sandboxes deleted through the API.\n\n\
| network | what | p50 ms | p95 ms | delete p50 / p95 ms |\n|---|---|---|---|---|\n{}\n\n\
Goal: p50 create-to-ready ≤ 1.0 × `runc run` p50 in the same run, then ≤ 10 ms.\n<!-- CREATE:END -->",
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
