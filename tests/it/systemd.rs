//! The systemd integration, end to end with the real binary: the shipped
//! unit files pass `systemd-analyze verify`; sd_notify (`READY=1` only after
//! reconciliation and once the API answers, `WATCHDOG=1`, `STOPPING=1`);
//! socket activation on fds the test passes itself.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TOKEN;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

// ---------------------------------------------------------------- verify

#[test]
fn shipped_units_pass_systemd_analyze_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let service = std::fs::read_to_string(units.join("sandboxd.service")).unwrap();
    let socket = std::fs::read_to_string(units.join("sandboxd.socket")).unwrap();
    // The behaviour operators rely on, pinned.
    for line in [
        "Type=notify",
        "NotifyAccess=main",
        "KillMode=process",
        "Delegate=yes",
        "Restart=on-failure",
        "StateDirectory=sandboxd",
        "EnvironmentFile=-/etc/sandboxd/sandboxd.env",
        "ExecStart=/usr/local/bin/sandboxd serve --config /etc/sandboxd/config.toml",
    ] {
        assert!(
            service.lines().any(|l| l == line),
            "sandboxd.service lacks {line:?}"
        );
    }
    assert!(socket.lines().any(|l| l == "ListenStream=127.0.0.1:8002"));

    if !common::require_tool("systemd-analyze", "apt-get install systemd") {
        return;
    }
    // verify checks that ExecStart exists: point it at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let service = service.replace("/usr/local/bin/sandboxd", BIN);
    assert!(service.contains(BIN));
    std::fs::write(dir.path().join("sandboxd.service"), service).unwrap();
    std::fs::write(dir.path().join("sandboxd.socket"), socket).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("sandboxd.service"))
        .arg(dir.path().join("sandboxd.socket"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("systemd-analyze verify: {stderr}");
    assert!(out.status.success(), "verify failed: {stderr}");
    // Unknown keys and bad values are only warnings (exit 0): refuse them.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("sandboxd.service") || l.contains("sandboxd.socket"))
        .collect();
    assert!(ours.is_empty(), "verify warnings about our units: {ours:?}");
}

// ---------------------------------------------------------------- helpers

/// A daemon process with its log collected line by line.
struct Proc {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        // The test runner's own systemd variables (if any) are not for it.
        for name in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "LISTEN_FDS",
            "LISTEN_PID",
            "LISTEN_FDNAMES",
        ] {
            if !cmd.get_envs().any(|(k, _)| k == name) {
                cmd.env_remove(name);
            }
        }
        cmd.env_remove("SANDBOXD_CONFIG")
            .env("SANDBOX_PROVISIONER_TOKEN", TOKEN)
            .env("RUST_LOG", "info")
            .env("SANDBOXD_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn sandboxd");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[sandboxd] {line}");
                log2.lock().unwrap().push(line);
            }
        });
        Proc { child, log }
    }

    fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits (at most 10 s) until a line contains `needle`: the daemon
    /// writes a line before it answers, but the thread reading its stderr
    /// may see it only after the test saw the answer.
    fn wait_log(&self, needle: &str) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while !self.log_contains(needle) {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn sigterm(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < end, "daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_cmd(state_dir: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--state-dir")
        .arg(state_dir);
    cmd
}

/// The test's end of `$NOTIFY_SOCKET`.
struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn new() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        NotifySocket {
            sock,
            path,
            _dir: dir,
        }
    }

    /// The next message, or None after `timeout`.
    fn recv(&self, timeout: Duration) -> Option<String> {
        self.sock.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("recv: {e}"),
        }
    }

    /// Waits for a message containing `needle` (skipping others, e.g.
    /// watchdog pings); returns it.
    fn wait_for(&self, needle: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.recv(left) {
                Some(m) if m.lines().any(|l| l == needle) => return m,
                Some(_) => continue,
                None => break,
            }
        }
        panic!("no {needle:?} notification within {timeout:?}");
    }
}

/// `GET /health` over a Unix socket, one connection; returns the status line.
fn health_unix(path: &Path) -> std::io::Result<String> {
    let mut s = UnixStream::connect(path)?;
    http_get(&mut s, "/health")
}

fn http_get(s: &mut (impl Read + Write), path: &str) -> std::io::Result<String> {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------- sd_notify

/// READY=1 (with MAINPID) only once the API answers; STOPPING=1 on SIGTERM.
#[test]
fn notify_ready_when_serving_and_stopping_on_sigterm() {
    let notify = NotifySocket::new();
    let state = tempfile::tempdir().unwrap();
    let api_sock = state.path().join("api.sock");
    let mut cmd = serve_cmd(state.path());
    cmd.arg("--unix-socket")
        .arg(&api_sock)
        .env("PROVISIONER_BACKEND", "memory")
        // A slow-ish start would show a READY sent too early.
        .env("NOTIFY_SOCKET", &notify.path);
    let mut d = Proc::spawn(cmd);

    let ready = notify.wait_for("READY=1", Duration::from_secs(60));
    // At this very moment the API must answer.
    let resp = health_unix(&api_sock).expect("API not reachable when READY=1 arrived");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        ready
            .lines()
            .any(|l| l == format!("MAINPID={}", d.child.id())),
        "{ready:?}"
    );
    assert!(ready.lines().any(|l| l.starts_with("STATUS=")), "{ready:?}");
    assert!(d.wait_log("start-up reconciliation done"));
    // No watchdog was asked for: none is sent.
    assert_eq!(notify.recv(Duration::from_millis(300)), None);

    d.sigterm();
    let stopping = notify.wait_for("STOPPING=1", Duration::from_secs(10));
    assert!(stopping.contains("STATUS="), "{stopping:?}");
    assert!(d.wait_exit(Duration::from_secs(30)).success());
}

/// systemd may stop the daemon the moment it reports READY=1: the signal
/// handlers are in place by then, so that stop is graceful (STOPPING=1,
/// exit 0), never the default action of SIGTERM.
#[test]
fn sigterm_right_after_ready_is_a_graceful_stop() {
    for round in 0..20 {
        let notify = NotifySocket::new();
        let state = tempfile::tempdir().unwrap();
        let mut cmd = serve_cmd(state.path());
        cmd.env("PROVISIONER_BACKEND", "memory")
            .env("NOTIFY_SOCKET", &notify.path);
        let mut d = Proc::spawn(cmd);
        notify.wait_for("READY=1", Duration::from_secs(60));
        d.sigterm();
        let status = d.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "round {round}: {status:?}");
        notify.wait_for("STOPPING=1", Duration::from_secs(1));
    }
}

/// WATCHDOG=1 every WATCHDOG_USEC/2; none when WATCHDOG_PID names another
/// process; abstract `@` notify sockets work.
#[test]
fn watchdog_pings_at_half_the_interval() {
    let notify = NotifySocket::new();
    let state = tempfile::tempdir().unwrap();
    let mut cmd = serve_cmd(state.path());
    cmd.env("PROVISIONER_BACKEND", "memory")
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "200000");
    let _d = Proc::spawn(cmd);
    notify.wait_for("READY=1", Duration::from_secs(60));
    let start = Instant::now();
    let mut pings = 0;
    while start.elapsed() < Duration::from_millis(1000) {
        if let Some(m) = notify.recv(Duration::from_millis(500)) {
            assert_eq!(m, "WATCHDOG=1");
            pings += 1;
        } else {
            panic!("watchdog pings stopped after {pings}");
        }
    }
    // Every 100 ms: about 10 in a second; a slow machine may lose a few.
    assert!((5..=15).contains(&pings), "{pings} pings in 1 s");

    // The watchdog is another process's: no pings.
    let name = format!("sandboxd-notify-test-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let abs = UnixDatagram::bind_addr(&addr).unwrap();
    abs.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut cmd = serve_cmd(state.path());
    cmd.env("PROVISIONER_BACKEND", "memory")
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .env("WATCHDOG_USEC", "200000")
        .env("WATCHDOG_PID", "1");
    let _d = Proc::spawn(cmd);
    let mut buf = [0u8; 512];
    let n = abs.recv(&mut buf).expect("READY=1 on the abstract socket");
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    let n2 = if first.contains("READY=1") {
        0
    } else {
        // STATUS=reconciling comes first.
        abs.recv(&mut buf).unwrap()
    };
    if n2 > 0 {
        assert!(String::from_utf8_lossy(&buf[..n2]).contains("READY=1"));
    }
    abs.set_read_timeout(Some(Duration::from_millis(600)))
        .unwrap();
    assert!(
        abs.recv(&mut buf).is_err(),
        "watchdog ping sent although WATCHDOG_PID is not ours"
    );
}

/// With the native backend and a stale sandbox directory in the state dir,
/// READY=1 arrives only after reconciliation removed it.
#[test]
fn notify_ready_after_native_reconciliation() {
    if !common::privileged("notify_ready_after_native_reconciliation") {
        return;
    }
    let dirs = common::NativeDirs::new();
    let notify = NotifySocket::new();
    let state = tempfile::tempdir().unwrap();
    let stale = state.path().join("sandboxes").join("stale0123456");
    std::fs::create_dir_all(stale.join("bundle")).unwrap();
    let api_sock = state.path().join("api.sock");
    let mut cmd = serve_cmd(state.path());
    cmd.arg("--unix-socket")
        .arg(&api_sock)
        .env("PROVISIONER_BACKEND", "native")
        .env("SANDBOXD_USER_DATA_ROOT", dirs.user_data())
        .env("SANDBOXD_SKILLS_ROOT", dirs.skills())
        .env("SANDBOXD_CGROUP_PARENT", &dirs.cgroup_parent)
        // The test's own table, veth prefix and pool (see NativeDirs).
        .env("SANDBOXD_NETWORK_TABLE", &dirs.net_table)
        .env("SANDBOXD_NETWORK_LINK_PREFIX", &dirs.net_prefix)
        .env("SANDBOXD_NETWORK_SUBNET", &dirs.net_subnet)
        .env("NOTIFY_SOCKET", &notify.path);
    let mut d = Proc::spawn(cmd);
    notify.wait_for("READY=1", Duration::from_secs(60));
    assert!(!stale.exists(), "READY=1 before reconciliation cleaned up");
    let resp = health_unix(&api_sock).expect("API not reachable at READY=1");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // The log thread may lag behind the datagram a little.
    let end = Instant::now() + Duration::from_secs(5);
    while !d.log_contains("native backend reconciled its state directory") {
        assert!(Instant::now() < end, "no reconciliation log line");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.log_contains("removing sandbox directory without state"));
    d.sigterm();
    notify.wait_for("STOPPING=1", Duration::from_secs(10));
    assert!(d.wait_exit(Duration::from_secs(30)).success());
}

// ---------------------------------------------------------------- activation

/// Duplicates `fd` to a number >= 10 (close-on-exec), so the child's dup2
/// onto 3 and 4 never clobbers a source.
fn high_fd(fd: &impl AsRawFd) -> OwnedFd {
    let n = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10)).unwrap();
    // SAFETY: fcntl just returned this new fd; nothing else owns it.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(n) }
}

#[test]
fn socket_activation_serves_on_passed_fds() {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let unix_path = dir.path().join("api.sock");
    let unix = std::os::unix::net::UnixListener::bind(&unix_path).unwrap();
    let (a, b) = (high_fd(&tcp), high_fd(&unix));
    let (a_raw, b_raw) = (a.as_raw_fd(), b.as_raw_fd());
    drop((tcp, unix));

    let state = tempfile::tempdir().unwrap();
    // LISTEN_PID must be the daemon's pid: the shell sets it to its own and
    // execs the daemon, which keeps the pid. The configured listen address
    // would be refused (non-loopback): it must not be used at all.
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ exec "$0" serve --listen 192.0.2.1:80 --state-dir "$1""#)
        .arg(BIN)
        .arg(state.path())
        .env("PROVISIONER_BACKEND", "memory")
        .env("LISTEN_FDNAMES", "api:api-unix");
    // SAFETY: only dup2, which is async-signal-safe, runs between fork and
    // exec; the fds are open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::dup2(a_raw, 3)?;
            nix::unistd::dup2(b_raw, 4)?;
            Ok(())
        });
    }
    cmd.env("LISTEN_FDS", "2");
    let mut p = Proc::spawn(cmd);
    drop((a, b));

    let end = Instant::now() + Duration::from_secs(60);
    let resp = loop {
        let r =
            std::net::TcpStream::connect(tcp_addr).and_then(|mut s| http_get(&mut s, "/health"));
        if let Ok(r) = r {
            if r.starts_with("HTTP/1.1 200") {
                break r;
            }
        }
        if let Some(s) = p.child.try_wait().unwrap() {
            panic!("daemon exited: {s} {:?}", p.log.lock().unwrap());
        }
        assert!(
            Instant::now() < end,
            "no answer on the activated TCP socket"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(resp.starts_with("HTTP/1.1 200"));
    let resp = health_unix(&unix_path).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(p.wait_log("socket activation"));
    assert!(p.wait_log("api-unix"));

    // Sandbox URLs name the activated address, not the unused --listen.
    let mut s = std::net::TcpStream::connect(tcp_addr).unwrap();
    let body = serde_json::to_string(&common::create_body("act1", "t", "u")).unwrap();
    write!(
        s,
        "POST /api/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.contains(&format!("http://{tcp_addr}/api/sandboxes/act1/proxy")),
        "{out}"
    );
    p.sigterm();
    assert!(p.wait_exit(Duration::from_secs(30)).success());
}

/// `LISTEN_FDS` meant for another process (a parent that did not clear it)
/// is ignored: the daemon binds its configured address.
#[test]
fn listen_fds_for_another_pid_are_ignored() {
    let state = tempfile::tempdir().unwrap();
    let api_sock = state.path().join("api.sock");
    let mut cmd = serve_cmd(state.path());
    cmd.arg("--unix-socket")
        .arg(&api_sock)
        .env("PROVISIONER_BACKEND", "memory")
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", "1");
    let p = Proc::spawn(cmd);
    let end = Instant::now() + Duration::from_secs(60);
    while !p.log_contains("address=unix:") {
        assert!(Instant::now() < end, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let resp = health_unix(&api_sock).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(p.log_contains("LISTEN_PID is not ours"));
    assert!(!p.log_contains("socket activation"));
}
