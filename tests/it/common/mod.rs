//! Shared test harness: starts the real `sandboxd` binary on an ephemeral
//! port and talks HTTP to it; a tiny in-process upstream server.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[cfg(feature = "images")]
pub mod oci;
pub mod probe;
pub mod upstream;

pub type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub const TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";

/// `RUST_LOG` of a test daemon whose barriers include the lines it writes
/// at debug level: each pass of the idle reaper ([`IDLE_CHECK`]), each
/// parking of upstream connections ([`PARKED`]).
pub const BARRIER_LOG: &str = "info,sandboxd::lifecycle::idle=debug,sandboxd::api::upstream=debug";
/// The idle reaper finished a pass (debug: [`BARRIER_LOG`]).
pub const IDLE_CHECK: &str = "idle check done";
/// A delete closed a sandbox's gate and waits for its proxied requests.
pub const DELETE_WAITS: &str = "delete waits for in-flight proxy requests";
/// A closed client connection parked its upstream connections (debug:
/// [`BARRIER_LOG`]).
pub const PARKED: &str = "upstream connections parked";

/// Lowercase hex of `bytes` (a sha256 sum as `sha256sum` prints it).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// A binary of the workspace built next to `sandboxd` (`sandbox-init` by
/// its own package, the static `sandbox-agent` by the root build script).
pub fn sibling_bin(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_sandboxd")).with_file_name(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace (cargo build)",
        p.display()
    );
    p
}

pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    pub state_dir: tempfile::TempDir,
    pub log: Arc<Mutex<Vec<String>>>,
    pub client: Client<HttpConnector, Body>,
    /// On drop, stop with SIGTERM (the daemon then stops its sandboxes when
    /// started with `SANDBOXD_STOP_SANDBOXES_ON_EXIT`) instead of SIGKILL.
    pub graceful_drop: bool,
}

impl Daemon {
    /// Starts `sandboxd serve` with the memory backend and `env` on top.
    pub fn start_memory(env: &[(&str, &str)]) -> Daemon {
        let mut all = vec![("PROVISIONER_BACKEND", "memory")];
        all.extend_from_slice(env);
        Daemon::start(&all, &[])
    }

    /// Starts `sandboxd serve --listen 127.0.0.1:0` with `env`; waits for
    /// its "listening" log line.
    pub fn start(env: &[(&str, &str)], args: &[&str]) -> Daemon {
        let state_dir = tempfile::tempdir().unwrap();
        Daemon::start_in(state_dir, env, args)
    }

    pub fn start_in(state_dir: tempfile::TempDir, env: &[(&str, &str)], args: &[&str]) -> Daemon {
        Daemon::start_at(state_dir, env, args, "127.0.0.1:0")
    }

    /// Like [`start_in`](Self::start_in), listening on `listen`.
    pub fn start_at(
        state_dir: tempfile::TempDir,
        env: &[(&str, &str)],
        args: &[&str],
        listen: &str,
    ) -> Daemon {
        Daemon::start_command(
            Command::new(env!("CARGO_BIN_EXE_sandboxd")),
            state_dir,
            env,
            args,
            listen,
        )
    }

    /// Like [`start_at`](Self::start_at), with `cmd` as the program instead
    /// of the binary under test (`nsenter ... /usr/bin/sandboxd` runs an
    /// installed one in another mount namespace); `serve` and its options
    /// are appended.
    pub fn start_command(
        mut cmd: Command,
        state_dir: tempfile::TempDir,
        env: &[(&str, &str)],
        args: &[&str],
        listen: &str,
    ) -> Daemon {
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--state-dir")
            .arg(state_dir.path())
            .args(args)
            .env_remove("SANDBOXD_CONFIG")
            .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
            .env("RUST_LOG", "info")
            // The tests read the text format (a piped stderr means JSON by
            // default); `tests/it/logs_json.rs` reads the JSON one.
            .env("SANDBOXD_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sandboxd");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Text (`address=http://…`) or JSON (`"address":"http://…"`).
                let at = ["address=http://", "\"address\":\"http://"]
                    .iter()
                    .find_map(|k| line.find(k).map(|i| i + k.len()));
                if let Some(i) = at {
                    let a = line[i..]
                        .split(|c: char| c.is_whitespace() || c == '"')
                        .next()
                        .unwrap()
                        .to_string();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(a);
                    }
                }
                eprintln!("[sandboxd] {line}");
                log2.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("sandboxd did not start: {:?}", log.lock().unwrap()));
        Daemon {
            child,
            addr: addr.parse().unwrap(),
            state_dir,
            log,
            client: Client::builder(TokioExecutor::new()).build_http(),
            graceful_drop: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends a request; returns status, headers and the whole body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Body>,
        token: Option<&str>,
    ) -> (u16, http::HeaderMap, Bytes) {
        let mut b = http::Request::builder().method(method).uri(self.url(path));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let req = b.body(body.unwrap_or_else(|| full(Bytes::new()))).unwrap();
        let resp = self.client.request(req).await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, headers, bytes)
    }

    /// Authenticated JSON call.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let body = body.map(|v| full(serde_json::to_vec(&v).unwrap()));
        let (s, _, b) = self.call(method, path, body, Some(TOKEN)).await;
        let v = serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null);
        (s, v)
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.log_contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// How many log lines contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until at least `n` log lines contain `needle`, without
    /// blocking the test's runtime (its other tasks go on meanwhile): a
    /// barrier on a line the daemon writes when it reaches a point.
    pub async fn until_log(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.log_count(needle) < n {
            if Instant::now() > end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.graceful_drop && matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let end = Instant::now() + Duration::from_secs(15);
            while Instant::now() < end {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a field (in KiB) of `/proc/<pid>/status`, e.g. `VmRSS`, `VmHWM`.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

pub fn create_body(id: &str, thread: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({"sandbox_id": id, "thread_id": thread, "uid": uid})
}

/// True when privileged tests can run; prints a loud reason otherwise (and
/// fails under CI, which runs as root).
/// Failpoint tests need the test's own build of the binaries: `cargo test`
/// builds `sandboxd` and `sandbox-init` with the `failpoints` feature, a
/// plain `cargo build` rebuilds them without it. Fails with the fix named.
pub fn require_failpoints() {
    // (the test binary itself always has them: the dev-dependency turns
    // the feature on)
    for bin in [
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_sandboxd")),
        sibling_bin("sandbox-init"),
    ] {
        let out = Command::new(&bin).arg("--version").output().unwrap();
        let v = String::from_utf8_lossy(&out.stdout);
        assert!(
            v.contains("(failpoints)"),
            "{} was built without failpoints ({}): a plain `cargo build` replaced the test \
             build; run `cargo test --workspace` (it rebuilds both)",
            bin.display(),
            v.trim()
        );
    }
}

pub fn privileged(test: &str) -> bool {
    nix::unistd::geteuid().is_root()
        || cannot_run(&format!("{test}: needs root (namespaces, mounts, cgroups)"))
}

/// A test that cannot run here for `why`: under `CI=true` (which runs as
/// root with every tool `.ci/run` installs) a failure, so a skip is never
/// reported as a pass there; elsewhere a loud `SKIPPED` and false (the
/// caller returns).
pub fn cannot_run(why: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("{why}; CI=true, where every test must run, so this is a failure");
    }
    eprintln!("\n*** SKIPPED {why} ***\n");
    false
}

/// The current test's name (libtest names the thread a test runs on).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string()
}

/// Where `tool` (a name looked up on `PATH`, or a path) is, if it is
/// installed as an executable.
pub fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if tool.contains('/') {
        let p = std::path::PathBuf::from(tool);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| executable(p))
}

/// True when `tool` is installed; otherwise [`cannot_run`] with `install`
/// (how to get it) named: a failure under `CI=true`, a loud skip elsewhere.
/// The one check for a missing tool: no test returns early without it.
pub fn require_tool(tool: &str, install: &str) -> bool {
    find_tool(tool).is_some()
        || cannot_run(&format!(
            "{}: {tool} is not installed ({install}; .ci/run does)",
            test_name()
        ))
}

/// Host directories of a native-backend daemon under test.
pub struct NativeDirs {
    pub root: tempfile::TempDir,
    /// A cgroup parent of this test's own, so concurrent test daemons
    /// never take each other's cgroups for orphans.
    pub cgroup_parent: String,
    /// This test's own nftables table, veth prefix and address pool (a
    /// /25 of 10.243.0.0/16), so concurrent test daemons never sweep each
    /// other's veths or rebuild each other's table.
    pub net_table: String,
    pub net_prefix: String,
    pub net_subnet: String,
    /// This test's own slice of host ids for user namespaces (32 slots of
    /// 65536), so concurrent test daemons never give two sandboxes the
    /// same host ids (and so the same per-user kernel limits).
    pub userns_range_start: String,
}

impl Drop for NativeDirs {
    /// Kills and removes whatever the test left under its cgroup parent
    /// (sandboxes outlive a dropped daemon by design, and a failed test
    /// never reaches its deletes), then the parent itself. Declare the
    /// `NativeDirs` before the `Daemon` so the daemon is gone first.
    fn drop(&mut self) {
        // The test's nftables table (the daemon leaves its table behind on
        // exit by design; sandboxes may outlive it).
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.net_table])
            .stderr(Stdio::null())
            .status();
        if let Ok(root) = sandboxd::cgroups::CgroupRoot::detect(&self.cgroup_parent) {
            if let Err(e) = root.remove_orphans(&Default::default()) {
                eprintln!("cleanup of cgroup parent {}: {e}", self.cgroup_parent);
            }
        }
        for c in [
            "memory", "pids", "cpu", "cpuacct", "cpuset", "freezer", "devices", "blkio", "unified",
            "",
        ] {
            let p = std::path::Path::new("/sys/fs/cgroup")
                .join(c)
                .join(&self.cgroup_parent);
            let _ = std::fs::remove_dir(p);
        }
    }
}

impl NativeDirs {
    pub fn new() -> NativeDirs {
        let root = tempfile::Builder::new()
            .prefix("sandboxd-test-")
            .tempdir()
            .unwrap();
        let cgroup_parent = format!(
            "sandboxd-test-{}",
            root.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .trim_start_matches("sandboxd-test-")
        );
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // `SANDBOXD_TEST_SLOT_BASE` shifts the slots, so two test runs on
        // one machine at once (two checkouts) never share a table, a veth
        // prefix or an address pool.
        let base: u32 = std::env::var("SANDBOXD_TEST_SLOT_BASE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let n = (base + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) % 512;
        NativeDirs {
            root,
            cgroup_parent,
            net_table: format!("sandboxd_t{n}"),
            net_prefix: format!("st{n}-"),
            net_subnet: format!("10.243.{}.{}/25", n / 2, (n % 2) * 128),
            userns_range_start: ((1u64 << 31) + u64::from(n) * 32 * 65536).to_string(),
        }
    }

    /// What this test's daemons left of sandbox networking on the host:
    /// veths with its prefix, addresses in its pool, elements of its
    /// table's `sandboxes` set.
    pub fn net_leftovers(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with(&self.net_prefix) {
                out.insert(format!("link {name}"));
            }
        }
        let pool = self.net_subnet.rsplit_once('.').unwrap().0.to_string() + ".";
        let addrs = Command::new("ip")
            .args(["-o", "-4", "addr"])
            .output()
            .unwrap();
        for l in String::from_utf8_lossy(&addrs.stdout).lines() {
            let Some(a) = l.split_whitespace().nth(3) else {
                continue;
            };
            if let Some(host) = a.split('/').next().and_then(|a| a.strip_prefix(&pool)) {
                let last: u32 = host.parse().unwrap_or(0);
                let lo = if self.net_subnet.ends_with(".128/25") {
                    128
                } else {
                    0
                };
                if (lo..lo + 128).contains(&last) {
                    out.insert(format!("address {a}"));
                }
            }
        }
        let set = Command::new("nft")
            .args(["-j", "list", "set", "inet", &self.net_table, "sandboxes"])
            .output()
            .unwrap();
        if set.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&set.stdout).unwrap();
            for o in v["nftables"].as_array().into_iter().flatten() {
                for e in o["set"]["elem"].as_array().into_iter().flatten() {
                    out.insert(format!("element {e}"));
                }
            }
        }
        out
    }
    pub fn user_data(&self) -> std::path::PathBuf {
        self.root.path().join("user-data")
    }
    pub fn skills(&self) -> std::path::PathBuf {
        self.root.path().join("skills")
    }
    pub fn workspace(&self, uid: &str) -> std::path::PathBuf {
        self.user_data().join("shared").join(uid).join("workspace")
    }
}

impl Default for NativeDirs {
    fn default() -> Self {
        Self::new()
    }
}

impl Daemon {
    /// Starts the daemon with the native backend over `dirs`. Dropping it
    /// stops its sandboxes too (SIGTERM with `stop_sandboxes_on_exit`), so
    /// tests leave no sandbox processes behind; `kill()` keeps them.
    pub fn start_native(dirs: &NativeDirs, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_native_in(dirs, tempfile::tempdir().unwrap(), env)
    }

    /// Like [`start_native`](Self::start_native) over an existing state
    /// directory (a restart: take it from the dead daemon with
    /// [`take_state_dir`](Self::take_state_dir)).
    pub fn start_native_in(
        dirs: &NativeDirs,
        state_dir: tempfile::TempDir,
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::start_native_at(dirs, state_dir, env, "127.0.0.1:0")
    }

    /// Like [`start_native_in`](Self::start_native_in), listening on `listen`.
    pub fn start_native_at(
        dirs: &NativeDirs,
        state_dir: tempfile::TempDir,
        env: &[(&str, &str)],
        listen: &str,
    ) -> Daemon {
        Daemon::start_native_command(
            Command::new(env!("CARGO_BIN_EXE_sandboxd")),
            dirs,
            state_dir,
            env,
            listen,
        )
    }

    /// Like [`start_native_at`](Self::start_native_at), with `cmd` as the
    /// program (see [`start_command`](Self::start_command)).
    pub fn start_native_command(
        cmd: Command,
        dirs: &NativeDirs,
        state_dir: tempfile::TempDir,
        env: &[(&str, &str)],
        listen: &str,
    ) -> Daemon {
        let ud = dirs.user_data().to_string_lossy().to_string();
        let sk = dirs.skills().to_string_lossy().to_string();
        let mut all = vec![
            ("PROVISIONER_BACKEND", "native"),
            ("SANDBOXD_USER_DATA_ROOT", ud.as_str()),
            ("SANDBOXD_SKILLS_ROOT", sk.as_str()),
            ("SANDBOX_HEALTH_TIMEOUT_SECONDS", "30"),
            ("SANDBOXD_CGROUP_PARENT", dirs.cgroup_parent.as_str()),
            ("SANDBOXD_STOP_SANDBOXES_ON_EXIT", "true"),
            ("SANDBOXD_NETWORK_TABLE", dirs.net_table.as_str()),
            ("SANDBOXD_NETWORK_LINK_PREFIX", dirs.net_prefix.as_str()),
            ("SANDBOXD_NETWORK_SUBNET", dirs.net_subnet.as_str()),
            (
                "SANDBOXD_USERNS_RANGE_START",
                dirs.userns_range_start.as_str(),
            ),
            ("SANDBOXD_USERNS_RANGE_COUNT", "2097152"),
            // No warm pool unless a test asks for one (native_pool): the
            // daemon's default too, spelled out.
            ("SANDBOXD_POOL_SIZE", "0"),
        ];
        all.extend_from_slice(env);
        let mut d = Daemon::start_command(cmd, state_dir, &all, &[], listen);
        d.graceful_drop = true;
        d
    }

    /// Keys of the unclaimed pool members (their state directories).
    pub fn pool_members(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.state_dir.path().join("sandboxes"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(".pool-"))
            .collect();
        v.sort();
        v
    }

    /// The `state.json` of sandbox (or pool member) `id`.
    pub fn sandbox_state(&self, id: &str) -> serde_json::Value {
        let p = self
            .state_dir
            .path()
            .join("sandboxes")
            .join(id)
            .join("state.json");
        serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
    }

    /// Moves the state directory out (a fresh empty one takes its place),
    /// so that a new daemon can start over it after this one is killed.
    pub fn take_state_dir(&mut self) -> tempfile::TempDir {
        std::mem::replace(&mut self.state_dir, tempfile::tempdir().unwrap())
    }

    /// Creates a sandbox; returns (status, body).
    pub async fn create(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.json("POST", "/api/sandboxes", Some(body)).await
    }

    /// Runs `cmd` in sandbox `id` through the proxy; returns
    /// (output, exit_code).
    pub async fn exec(&self, id: &str, cmd: &str) -> (String, i64) {
        let (s, v) = self
            .json(
                "POST",
                &format!("/api/sandboxes/{id}/proxy/v1/shell/exec"),
                Some(serde_json::json!({ "command": cmd, "timeout": 60 })),
            )
            .await;
        assert_eq!(s, 200, "exec {cmd:?} in {id}: {v}");
        (
            v["data"]["output"].as_str().unwrap_or_default().to_string(),
            v["data"]["exit_code"].as_i64().unwrap_or(-1),
        )
    }
}

/// Creates `path` (and missing parents) owned by the sandbox user, as the
/// platform would have made a user's project directories.
pub fn mkdir_user(path: &std::path::Path) {
    let mut missing = Vec::new();
    let mut p = path.to_path_buf();
    while !p.exists() {
        missing.push(p.clone());
        if !p.pop() {
            break;
        }
    }
    std::fs::create_dir_all(path).unwrap();
    for m in missing {
        std::os::unix::fs::chown(&m, Some(1000), Some(1000)).unwrap();
    }
}

/// Processes whose parent is `daemon_pid` (sandbox PID 1s are re-parented
/// to the daemon, a subreaper).
pub fn children_of(daemon_pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
                == Some(daemon_pid)
        })
        .count()
}

/// Runs `script` with `/bin/sh` as the root of sandbox `pid`'s user
/// namespace, in its mount namespace (and cgroup namespace with `cgroup`),
/// entered from the host with `nsenter`: every capability there and no
/// seccomp filter, the worst case. Returns stdout after checking that the
/// shell ran as uid 0 (`script` must print `id -u` first) and reached its
/// final `echo done`.
pub fn sh_as_sandbox_root(pid: u64, cgroup: bool, script: &str) -> String {
    let pid = pid.to_string();
    let mut args = vec!["-t", pid.as_str(), "-U", "-m"];
    if cgroup {
        args.push("-C");
    }
    args.extend(["--", "/bin/sh", "-c", script]);
    let out = std::process::Command::new("nsenter")
        .args(&args)
        .output()
        .expect("this test needs nsenter (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("0\n"),
        "nsenter did not become the sandbox's root: {text}"
    );
    assert!(text.ends_with("done\n"), "{text}");
    text
}
