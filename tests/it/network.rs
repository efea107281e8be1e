//! Sandbox networking (privileged): egress to a simulated internet, the
//! deny list, holes, `none`, DNS, cleanup over many cycles and after a
//! `kill -9`.
//!
//! Traffic only ever goes to loopback or into a network namespace this
//! test makes (`TestInternet`): its "public" (198.51.100.10, TEST-NET-2),
//! "private" (10.213.7.x) and "metadata" (169.254.169.254) addresses live
//! there, routed from the host through a veth of the test's own, so a
//! missing rule would send packets into that namespace, never off the
//! machine. Everything it makes is removed on drop, also on failure.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{privileged, Daemon, NativeDirs};
use serde_json::json;

/// Network tests share fixed test addresses: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NS: &str = "sbxtest-inet";
const HOST_IF: &str = "sbxti-h";
const NS_IF: &str = "sbxti-n";
/// The test's link between the host and its internet (TEST-NET-3).
const HOST_SIDE: &str = "203.0.113.1";
const NS_SIDE: &str = "203.0.113.2";
const PUBLIC: &str = "198.51.100.10";
const PRIVATE: &str = "10.213.7.2";
const PRIVATE_OTHER: &str = "10.213.7.3";
const RESOLVER: &str = "10.213.7.53";
const METADATA: &str = "169.254.169.254";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Nothing of this test's sandbox networking is left on the host. A
/// delete removes the veth and the set element in the background (the slot
/// is reused only after): waited for, bounded.
fn assert_no_net_leftovers(dirs: &NativeDirs) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = dirs.net_leftovers();
        if left.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < end, "{left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip").args(args).output();
}

/// A network namespace standing in for the internet, with TCP servers
/// answering `HTTP/1.0 200` and their own tag; every accepted connection
/// is recorded.
struct TestInternet {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// "addr:port" of every connection a server accepted.
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl TestInternet {
    fn new(servers: &[(&str, u16)]) -> TestInternet {
        let me = TestInternet {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            seen: Arc::new(Mutex::new(Vec::new())),
        };
        me.cleanup();
        ip(&["netns", "add", NS]);
        ip(&[
            "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF,
        ]);
        ip(&["link", "set", NS_IF, "netns", NS]);
        ip(&["addr", "add", &format!("{HOST_SIDE}/30"), "dev", HOST_IF]);
        ip(&["link", "set", HOST_IF, "up"]);
        ip(&[
            "-n",
            NS,
            "addr",
            "add",
            &format!("{NS_SIDE}/30"),
            "dev",
            NS_IF,
        ]);
        ip(&["-n", NS, "link", "set", NS_IF, "up"]);
        ip(&["-n", NS, "link", "set", "lo", "up"]);
        for a in [PUBLIC, PRIVATE, PRIVATE_OTHER, RESOLVER, METADATA] {
            ip(&["-n", NS, "addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        ip(&["-n", NS, "route", "add", "default", "via", HOST_SIDE]);
        for dst in [
            format!("{PUBLIC}/32"),
            "10.213.7.0/24".to_string(),
            format!("{METADATA}/32"),
        ] {
            ip(&["route", "add", &dst, "via", NS_SIDE, "dev", HOST_IF]);
        }
        let mut me = me;
        me.serve(servers);
        me
    }

    /// Binds the servers inside the namespace (from a thread that enters
    /// it and comes back), then serves them from threads of their own.
    fn serve(&mut self, servers: &[(&str, u16)]) {
        let servers: Vec<String> = servers.iter().map(|(a, p)| format!("{a}:{p}")).collect();
        let listeners = std::thread::spawn(move || {
            let home = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            let ns = std::fs::File::open(format!("/run/netns/{NS}")).unwrap();
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let ls: Vec<(String, TcpListener)> = servers
                .iter()
                .map(|s| (s.clone(), TcpListener::bind(s.as_str()).unwrap()))
                .collect();
            nix::sched::setns(home.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            ls
        })
        .join()
        .unwrap();
        for (tag, l) in listeners {
            l.set_nonblocking(true).unwrap();
            let (stop, seen) = (self.stop.clone(), self.seen.clone());
            self.threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut c, _)) => {
                            seen.lock().unwrap().push(tag.clone());
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                            let mut buf = [0u8; 512];
                            let _ = c.read(&mut buf);
                            let _ = write!(c, "HTTP/1.0 200 OK\r\n\r\nhello from {tag}\n");
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
    }

    fn seen(&self, tag: &str) -> bool {
        self.seen.lock().unwrap().iter().any(|s| s == tag)
    }

    fn cleanup(&self) {
        // Deleting the host end takes the peer (and the host routes via it).
        ip_quiet(&["link", "del", HOST_IF]);
        ip_quiet(&["netns", "del", NS]);
    }
}

impl Drop for TestInternet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.cleanup();
    }
}

/// Fetches `http://addr:port/` from sandbox `id` with bash's /dev/tcp;
/// returns (output, exit code): 124 is a timeout (a dropped packet).
async fn fetch(d: &Daemon, id: &str, addr: &str, port: u16) -> (String, i64) {
    let cmd = format!(
        "timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port} && printf \"GET / HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3' 2>&1; echo rc=$?"
    );
    let (out, _) = d.exec(id, &cmd).await;
    let rc = out
        .rsplit_once("rc=")
        .and_then(|(_, r)| r.trim().parse().ok())
        .unwrap_or(-1);
    (out, rc)
}

async fn assert_reaches(d: &Daemon, net: &TestInternet, id: &str, addr: &str, port: u16) {
    let (out, rc) = fetch(d, id, addr, port).await;
    assert_eq!(rc, 0, "{id} -> {addr}:{port}: {out}");
    assert!(out.contains(&format!("hello from {addr}:{port}")), "{out}");
    assert!(net.seen(&format!("{addr}:{port}")));
}

/// Dropped (a timeout, not a refusal: nothing answered) and never seen by
/// a server.
async fn assert_dropped(d: &Daemon, net: Option<&TestInternet>, id: &str, addr: &str, port: u16) {
    let (out, rc) = fetch(d, id, addr, port).await;
    assert_eq!(rc, 124, "{id} -> {addr}:{port} was not dropped: {out}");
    if let Some(net) = net {
        assert!(
            !net.seen(&format!("{addr}:{port}")),
            "{addr}:{port} saw a connection"
        );
    }
}

#[tokio::test]
async fn egress_reaches_the_internet_and_nothing_private() {
    if !privileged("egress_reaches_the_internet_and_nothing_private") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dirs = NativeDirs::new();
    let net = TestInternet::new(&[
        (PUBLIC, 80),
        (PRIVATE, 80),
        (PRIVATE, 3306),
        (PRIVATE, 3307),
        (PRIVATE_OTHER, 3306),
        (METADATA, 80),
        (RESOLVER, 53),
        (RESOLVER, 80),
    ]);
    let resolv = dirs.root.path().join("host-resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {RESOLVER}\nsearch example.test\n"),
    )
    .unwrap();
    // The API on a non-loopback address of the host (the test's veth).
    let d = Daemon::start_native_at(
        &dirs,
        tempfile::tempdir().unwrap(),
        &[
            ("SANDBOXD_ALLOW_NON_LOOPBACK", "true"),
            ("SANDBOXD_NETWORK_ALLOW", "10.213.7.2/32:3306"),
            ("SANDBOXD_NETWORK_RESOLV_CONF", resolv.to_str().unwrap()),
        ],
        &format!("{HOST_SIDE}:0"),
    );
    let (s, a) = d
        .create(json!({"sandbox_id":"na","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["network"]["mode"], "egress", "{a}");
    let a_addr = a["network"]["address"].as_str().unwrap().to_string();
    let gateway = a["network"]["gateway"].as_str().unwrap().to_string();
    let (s, b) = d
        .create(json!({"sandbox_id":"nb","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{b}");
    let b_addr = b["network"]["address"].as_str().unwrap().to_string();
    assert_ne!(a_addr, b_addr);
    // Discover shows it too.
    let (_, v) = d.json("GET", "/api/sandboxes/na", None).await;
    assert_eq!(v["network"]["address"], a_addr.as_str(), "{v}");

    // The internet: yes.
    assert_reaches(&d, &net, "na", PUBLIC, 80).await;
    // The hole: exactly that address and port.
    assert_reaches(&d, &net, "na", PRIVATE, 3306).await;
    assert_dropped(&d, Some(&net), "na", PRIVATE, 3307).await;
    assert_dropped(&d, Some(&net), "na", PRIVATE, 80).await;
    assert_dropped(&d, Some(&net), "na", PRIVATE_OTHER, 3306).await;
    // The metadata endpoint.
    assert_dropped(&d, Some(&net), "na", METADATA, 80).await;
    // The resolver in a denied range: port 53 only.
    assert_reaches(&d, &net, "na", RESOLVER, 53).await;
    assert_dropped(&d, Some(&net), "na", RESOLVER, 80).await;
    let (out, _) = d.exec("na", "cat /etc/resolv.conf").await;
    assert!(out.contains(&format!("nameserver {RESOLVER}\n")), "{out}");
    assert!(out.contains("search example.test"), "{out}");
    // The host itself: the daemon's API on a non-loopback address, and
    // the sandbox's own gateway (any port).
    assert_dropped(&d, None, "na", HOST_SIDE, d.addr.port()).await;
    assert_dropped(&d, None, "na", &gateway, d.addr.port()).await;
    assert_dropped(&d, None, "na", &gateway, 22).await;
    // Another sandbox (nothing listens there: a refusal would prove the
    // packet arrived; a timeout proves it was dropped).
    assert_dropped(&d, None, "na", &b_addr, 8080).await;
    assert_dropped(&d, None, "nb", &a_addr, 8080).await;
    // The host's API is still reached over the netns connector.
    let (out, _) = d.exec("nb", "echo ok").await;
    assert_eq!(out, "ok\n");

    // Metrics: drops by reason, bytes per sandbox.
    let (_, _, m) = d.call("GET", "/metrics", None, Some(common::TOKEN)).await;
    let m = String::from_utf8_lossy(&m);
    let denied = m
        .lines()
        .find(|l| l.starts_with("sandboxd_network_dropped_packets{reason=\"denied\"}"))
        .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(denied > 0, "{m}");
    assert!(
        m.contains("sandboxd_sandbox_network_bytes{sandbox_id=\"na\",direction=\"sent\"}"),
        "{m}"
    );

    for id in ["na", "nb"] {
        let (s, _) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200);
    }
    assert_no_net_leftovers(&dirs);
}

#[tokio::test]
async fn network_none_leaves_only_loopback() {
    if !privileged("network_none_leaves_only_loopback") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let (s, v) = d
        .create(json!({"sandbox_id":"lo1","thread_id":"t","uid":"u1","inherit_env":false,"network":"none"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["network"]["mode"], "none", "{v}");
    let (out, _) = d
        .exec(
            "lo1",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /etc/resolv.conf",
        )
        .await;
    assert_eq!(out, "lo\n# sandboxd: no network\n");
    assert_no_net_leftovers(&dirs);
    drop(d);

    // A daemon in mode none: loopback only, and egress cannot be asked for.
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_NETWORK", "none")]);
    let (s, v) = d
        .create(json!({"sandbox_id":"lo2","thread_id":"t","uid":"u1","inherit_env":false,"network":"egress"}))
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d
        .create(json!({"sandbox_id":"lo2","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, _) = d
        .exec("lo2", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .await;
    assert_eq!(out, "lo\n");
    // Mode none never touches nftables.
    let t = Command::new("nft")
        .args(["list", "table", "inet", &dirs.net_table])
        .output()
        .unwrap();
    assert!(!t.status.success(), "mode none made a table");
}

#[tokio::test]
async fn create_delete_cycles_leave_no_network_behind() {
    if !privileged("create_delete_cycles_leave_no_network_behind") {
        return;
    }
    let dirs = NativeDirs::new();
    // Only a loopback stub: no usable resolver (unless the host keeps a
    // systemd-resolved upstream list).
    let resolv = dirs.root.path().join("host-resolv.conf");
    std::fs::write(&resolv, "nameserver 127.0.0.53\n").unwrap();
    let d = Daemon::start_native(
        &dirs,
        &[("SANDBOXD_NETWORK_RESOLV_CONF", resolv.to_str().unwrap())],
    );
    let stub_only = !std::path::Path::new("/run/systemd/resolve/resolv.conf").exists();
    for i in 0..50 {
        let id = format!("cy{i}");
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id":"t","uid":"u1","inherit_env":false}))
            .await;
        assert_eq!(s, 200, "{v}");
        if i == 0 {
            assert_eq!(dirs.net_leftovers().len(), 3, "{:?}", dirs.net_leftovers());
            let (out, _) = d.exec(&id, "cat /etc/resolv.conf").await;
            if stub_only {
                assert!(!out.contains("nameserver"), "{out}");
            }
        }
        let (s, _) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200);
    }
    assert_no_net_leftovers(&dirs);
    if stub_only {
        let n = d
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("no usable DNS resolver"))
            .count();
        assert_eq!(n, 1);
    }
}

#[tokio::test]
async fn a_restart_after_kill_keeps_the_network_of_a_live_sandbox() {
    if !privileged("a_restart_after_kill_keeps_the_network_of_a_live_sandbox") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dirs = NativeDirs::new();
    let net = TestInternet::new(&[(PUBLIC, 80), (PRIVATE, 80)]);
    let mut d = Daemon::start_native(&dirs, &[]);
    let (s, v) = d
        .create(json!({"sandbox_id":"kr","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_reaches(&d, &net, "kr", PUBLIC, 80).await;
    let before = dirs.net_leftovers();
    assert_eq!(before.len(), 3, "{before:?}");
    d.kill();
    let state = d.take_state_dir();
    let d = Daemon::start_native_in(&dirs, state, &[]);
    let (_, v) = d.json("GET", "/api/sandboxes/kr", None).await;
    assert_eq!(v["status"], "running", "{v}");
    assert_eq!(dirs.net_leftovers(), before);
    net.seen.lock().unwrap().clear();
    assert_reaches(&d, &net, "kr", PUBLIC, 80).await;
    assert_dropped(&d, Some(&net), "kr", PRIVATE, 80).await;
    let (s, _) = d.json("DELETE", "/api/sandboxes/kr", None).await;
    assert_eq!(s, 200);
    assert_no_net_leftovers(&dirs);
}

/// `[network] max_connections` caps one sandbox's concurrent connections
/// (`ct count`): with a cap of 3, the fourth to sixth connections held at
/// once are dropped. And the operator's proxy variables (from the sandbox
/// env file) reach the sandbox's commands.
#[tokio::test]
async fn the_connection_cap_holds_and_proxy_variables_reach_the_sandbox() {
    if !privileged("the_connection_cap_holds_and_proxy_variables_reach_the_sandbox") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dirs = NativeDirs::new();
    let net = TestInternet::new(&[(PUBLIC, 80)]);
    let env_file = dirs.root.path().join("sandbox.env");
    std::fs::write(
        &env_file,
        format!("HTTP_PROXY=http://{PUBLIC}:3128\nHTTPS_PROXY=http://{PUBLIC}:3128\nNO_PROXY=localhost,127.0.0.1\n"),
    )
    .unwrap();
    let env_file_s = env_file.to_string_lossy().to_string();
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_NETWORK_MAX_CONNECTIONS", "3"),
            ("SANDBOXD_SANDBOX_ENV_FILE", env_file_s.as_str()),
        ],
    );
    let (s, v) = d
        .create(json!({"sandbox_id":"cap","thread_id":"t","uid":"u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, _) = d
        .exec("cap", "echo \"$HTTP_PROXY $HTTPS_PROXY $NO_PROXY\"")
        .await;
    assert_eq!(
        out,
        format!("http://{PUBLIC}:3128 http://{PUBLIC}:3128 localhost,127.0.0.1\n")
    );
    let script = format!(
        "import socket\n\
         held, ok = [], 0\n\
         for _ in range(6):\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(2)\n\
         \x20   try:\n\
         \x20       s.connect(('{PUBLIC}', 80)); ok += 1; held.append(s)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print(ok)\n"
    );
    std::fs::write(dirs.workspace("u1").join("cap.py"), script).unwrap();
    let (out, code) = d.exec("cap", "python3 /home/gem/user-data/cap.py").await;
    assert_eq!((out.trim(), code), ("3", 0), "{out}");
    drop(net);
}
