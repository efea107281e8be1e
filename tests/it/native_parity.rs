//! Behaviours the platform's client relies on since the Python provisioner
//! (the "[parity]" issue), on native sandboxes with real processes
//! (privileged; each test skips loudly when not root). The memory-backend
//! counterparts are in `api_parity.rs`.

use crate::common;
use crate::native_cgroups::cgroup_dirs;
use crate::native_durability::{agent_pid, sandbox_pids};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{full, privileged, Daemon, NativeDirs, BARRIER_LOG, DELETE_WAITS, IDLE_CHECK, TOKEN};
use http_body_util::BodyExt;
use serde_json::json;

fn ephemeral(id: &str) -> serde_json::Value {
    json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "inherit_env": false})
}

async fn create(d: &Daemon, body: serde_json::Value) -> serde_json::Value {
    let (s, v) = d.create(body).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Starts an authenticated request through the proxy; returns the response
/// without reading its (streamed) body.
async fn proxied(
    d: &Daemon,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> http::Response<hyper::body::Incoming> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let req = http::Request::builder()
        .method(method)
        .uri(d.url(path))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(full(body))
        .unwrap();
    d.client.request(req).await.unwrap()
}

/// Waits (bounded) until `id` is answered 404 by discover.
async fn wait_absent(d: &Daemon, id: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, v) = d.json("GET", &format!("/api/sandboxes/{id}"), None).await;
        if s == 404 {
            assert_eq!(v, json!({"detail": "sandbox not found"}));
            return;
        }
        assert!(Instant::now() < end, "{id} is still discovered: {s} {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kill_9(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// Links of the daemon's open fds that name `target` (e.g. a netns).
fn daemon_fds_naming(daemon: u32, target: &str) -> usize {
    std::fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == target))
        .count()
}

fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A sandbox whose PID 1 died is absent for discover, touch and the proxy
/// (the client then creates a fresh one); it stays listed as `exited`, with
/// `oom_killed` read before its cgroup went, and its netns fd, cgroup and
/// bundle are cleaned up at once. The next create makes a new generation;
/// an explicit delete still answers 200.
#[tokio::test]
async fn an_exited_sandbox_looks_absent_and_is_cleaned_up() {
    if !privileged("an_exited_sandbox_looks_absent_and_is_cleaned_up") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let mut body = ephemeral("gone");
    body["resources"] = json!({"memory_mb": 128});
    let first = create(&d, body.clone()).await;
    let (out, _) = d
        .exec("gone", "python3 -c 'b = b\"x\" * (400 << 20)'; echo rc=$?")
        .await;
    assert!(out.contains("rc=137"), "no OOM kill: {out}");
    let pid = agent_pid(&dirs, "gone");
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert_eq!(daemon_fds_naming(d.pid(), &netns), 1, "netns fd not held");
    let bundle = d.state_dir.path().join("sandboxes/gone/bundle");
    assert!(bundle.is_dir());
    assert!(!cgroup_dirs(&dirs.cgroup_parent, Some("gone")).is_empty());

    kill_9(pid);
    wait_absent(&d, "gone").await;
    let (s, v) = d.json("POST", "/api/sandboxes/gone/touch", None).await;
    assert_eq!((s, v), (404, json!({"detail": "sandbox not found"})));
    let (s, v) = d
        .json("GET", "/api/sandboxes/gone/proxy/v1/sandbox", None)
        .await;
    assert_eq!((s, v), (404, json!({"detail": "sandbox not found"})));
    // Operators still see it, with what happened to it.
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 1, "{v}");
    let listed = &v["sandboxes"][0];
    assert_eq!(listed["status"], "exited", "{v}");
    assert_eq!(listed["oom_killed"], true, "{v}");
    assert_eq!(listed["generation"], first["generation"]);
    // Cleaned up at exit: no netns fd, no cgroup, no bundle.
    assert!(
        eventually(Duration::from_secs(10), || {
            daemon_fds_naming(d.pid(), &netns) == 0
                && cgroup_dirs(&dirs.cgroup_parent, Some("gone")).is_empty()
                && !bundle.exists()
        }),
        "not cleaned up: netns fds {}, cgroups {:?}, bundle {}",
        daemon_fds_naming(d.pid(), &netns),
        cgroup_dirs(&dirs.cgroup_parent, Some("gone")),
        bundle.exists()
    );
    // The next create makes a new generation that works.
    let second = create(&d, body).await;
    assert_ne!(second["generation"], first["generation"]);
    assert_eq!(second["status"], "running");
    let (out, _) = d.exec("gone", "echo back").await;
    assert_eq!(out, "back\n");

    // An explicit delete of an exited sandbox answers as before.
    create(&d, ephemeral("dead")).await;
    kill_9(agent_pid(&dirs, "dead"));
    wait_absent(&d, "dead").await;
    let (s, v) = d.json("DELETE", "/api/sandboxes/dead", None).await;
    assert_eq!((s, v), (200, json!({"ok": true, "sandbox_id": "dead"})));
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 1, "{v}");
    assert!(!d.state_dir.path().join("sandboxes/dead").exists());
}

/// Quiesce waits for a create that passed the gate (held here at a
/// failpoint after its bundle is written) and then deletes it: no runtime
/// exists once quiesce has answered.
#[tokio::test]
async fn quiesce_waits_for_a_create_held_at_a_failpoint() {
    if !privileged("quiesce_waits_for_a_create_held_at_a_failpoint") {
        return;
    }
    if !sandboxd::failpoint::ENABLED {
        panic!("failpoints are compiled only with the failpoints feature (cargo test enables it)");
    }
    let dirs = NativeDirs::new();
    let pause = tempfile::tempdir().unwrap();
    let resume = pause.path().join("resume");
    let resume_s = resume.to_string_lossy().to_string();
    let d = Arc::new(Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_FAILPOINT", "create:after_bundle"),
            ("SANDBOXD_FAILPOINT_PAUSE", resume_s.as_str()),
        ],
    ));
    let d2 = d.clone();
    let create = tokio::spawn(async move { d2.create(ephemeral("late")).await });
    let paused = pause.path().join("resume.paused");
    let end = Instant::now() + Duration::from_secs(30);
    while !paused.exists() {
        assert!(Instant::now() < end, "the create never paused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d3 = d.clone();
    let quiesce = tokio::spawn(async move {
        d3.json("POST", "/api/sandboxes/quiesce?timeout_seconds=60", None)
            .await
    });
    // Quiesce closed the gate and counted the paused create: it waits for
    // it (the answer below counts it as deleted only if it did).
    let end = Instant::now() + Duration::from_secs(30);
    while !d
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("quiescing: create gate closed") && l.contains("creates_in_flight=1"))
    {
        assert!(Instant::now() < end, "quiesce never closed the gate");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !quiesce.is_finished(),
        "quiesce answered while a create was in flight: {:?}",
        quiesce.await
    );
    std::fs::write(&resume, "").unwrap();
    let (s, v) = create.await.unwrap();
    assert_eq!(s, 200, "{v}");
    let (s, v) = quiesce.await.unwrap();
    assert_eq!((s, v), (200, json!({"ok": true, "deleted": 1})));
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 0, "{v}");
    assert!(
        eventually(Duration::from_secs(10), || sandbox_pids(&dirs).is_empty()),
        "sandbox processes after quiesce: {:?}",
        sandbox_pids(&dirs)
    );
    assert!(cgroup_dirs(&dirs.cgroup_parent, Some("late")).is_empty());
    assert!(!d.state_dir.path().join("sandboxes/late").exists());
}

/// A download that lasts longer than the idle timeout marks activity when
/// it ends, so the sandbox is not reaped the moment it finishes.
#[tokio::test]
async fn a_download_longer_than_the_idle_timeout_keeps_the_sandbox() {
    if !privileged("a_download_longer_than_the_idle_timeout_keeps_the_sandbox") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOX_IDLE_TIMEOUT_SECONDS", "2"),
            ("SANDBOX_EXEC_TIMEOUT_SECONDS", "1"),
            ("SANDBOX_IDLE_CHECK_INTERVAL_SECONDS", "1"),
            ("RUST_LOG", BARRIER_LOG),
        ],
    );
    create(&d, ephemeral("dl")).await;
    let (_, code) = d.exec("dl", "truncate -s 64M /home/gem/big.bin").await;
    assert_eq!(code, 0);
    let resp = proxied(
        &d,
        "GET",
        "/api/sandboxes/dl/proxy/v1/file/download?path=/home/gem/big.bin",
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    // Read at 16 MB/s: the download takes about 4 s, twice the idle timeout.
    let mut body = resp.into_body();
    let started = Instant::now();
    let mut got = 0u64;
    while let Some(f) = body.frame().await {
        if let Ok(data) = f.unwrap().into_data() {
            got += data.len() as u64;
            let due = Duration::from_secs_f64(got as f64 / 16e6);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
    assert_eq!(got, 64 << 20);
    assert!(started.elapsed() > Duration::from_secs(3));
    // One more pass of the reaper (a pass takes microseconds: it began
    // after the download ended, within a check interval, so well inside
    // the idle timeout of the end), which finds the sandbox idle since its
    // admission 4 s ago unless the end counted as activity.
    let passes = d.log_count(IDLE_CHECK);
    assert!(
        d.until_log(IDLE_CHECK, passes + 1, Duration::from_secs(10))
            .await,
        "the reaper did not run"
    );
    let (s, v) = d.json("GET", "/api/sandboxes/dl", None).await;
    assert_eq!(s, 200, "reaped right after its download ended: {v}");
}

/// The agent's cap on a command follows `SANDBOX_EXEC_TIMEOUT_SECONDS`
/// (minus the margin), lower or above the agent's old fixed 170 s.
#[tokio::test]
async fn the_exec_cap_follows_the_exec_timeout() {
    if !privileged("the_exec_cap_follows_the_exec_timeout") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOX_EXEC_TIMEOUT_SECONDS", "6")]);
    create(&d, ephemeral("capped")).await;
    let started = Instant::now();
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes/capped/proxy/v1/shell/exec",
            Some(json!({"command": "echo before; sleep 20"})),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["data"]["status"], "hard_timeout", "{v}");
    assert_eq!(v["data"]["exit_code"], 124);
    assert!(took < Duration::from_secs(6), "answered after {took:?}");
    assert!(took > Duration::from_secs(4), "answered after {took:?}");
    drop(d);

    let d = Daemon::start_native(&dirs, &[("SANDBOX_EXEC_TIMEOUT_SECONDS", "260")]);
    create(&d, ephemeral("long")).await;
    let config = d.state_dir.path().join("sandboxes/long/bundle/config.json");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    let args: Vec<&str> = spec["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--exec-cap-seconds")
        .unwrap_or_else(|| panic!("no --exec-cap-seconds in {args:?}"));
    assert_eq!(args[at + 1], "250", "{args:?}");
    let (out, _) = d.exec("long", "echo ok").await;
    assert_eq!(out, "ok\n");
}

/// A sandbox that plants `out.csv -> /dev/zero` or a FIFO gets a prompt 400
/// through the proxy instead of a download that never ends; a missing
/// file says so; a regular download keeps its headers.
#[tokio::test]
async fn special_files_are_refused_and_missing_ones_say_so() {
    if !privileged("special_files_are_refused_and_missing_ones_say_so") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    create(&d, ephemeral("files")).await;
    let (_, code) = d
        .exec(
            "files",
            "cd /home/gem && ln -s /dev/zero out.csv && mkfifo pipe && printf hi > ok.txt",
        )
        .await;
    assert_eq!(code, 0);
    for name in ["out.csv", "pipe"] {
        let path = format!("/api/sandboxes/files/proxy/v1/file/download?path=/home/gem/{name}");
        let resp = tokio::time::timeout(Duration::from_secs(10), proxied(&d, "GET", &path, None))
            .await
            .unwrap_or_else(|_| panic!("download of {name}: no answer within 10 s"));
        assert_eq!(resp.status(), 400, "download of {name}");
        let v: serde_json::Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("is not a regular file"),
            "{v}"
        );
        let resp = tokio::time::timeout(
            Duration::from_secs(10),
            proxied(
                &d,
                "POST",
                "/api/sandboxes/files/proxy/v1/file/read",
                Some(json!({"file": format!("/home/gem/{name}")})),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("read of {name}: no answer within 10 s"));
        assert_eq!(resp.status(), 400, "read of {name}");
    }
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes/files/proxy/v1/file/read",
            Some(json!({"file": "/home/gem/nope.txt"})),
        )
        .await;
    assert_eq!(s, 404, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("/home/gem/nope.txt does not exist"),
        "{v}"
    );
    let resp = proxied(
        &d,
        "GET",
        "/api/sandboxes/files/proxy/v1/file/download?path=/home/gem/ok.txt",
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["content-length"], "2");
    assert!(h["content-disposition"]
        .to_str()
        .unwrap()
        .contains("ok.txt"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hi");
}

/// A download the platform stops reading does not hold a delete longer
/// than the grace period, and other sandboxes are served meanwhile.
#[tokio::test]
async fn delete_cancels_a_stuck_download_after_the_grace() {
    if !privileged("delete_cancels_a_stuck_download_after_the_grace") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Arc::new(Daemon::start_native(
        &dirs,
        &[("SANDBOXD_DELETE_GRACE_SECONDS", "1")],
    ));
    create(&d, ephemeral("big")).await;
    create(&d, ephemeral("calm")).await;
    let (_, code) = d.exec("big", "truncate -s 50G /home/gem/huge.bin").await;
    assert_eq!(code, 0);
    let resp = proxied(
        &d,
        "GET",
        "/api/sandboxes/big/proxy/v1/file/download?path=/home/gem/huge.bin",
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    // From here on nobody reads it.
    let d2 = d.clone();
    let started = Instant::now();
    let del = tokio::spawn(async move { d2.json("DELETE", "/api/sandboxes/big", None).await });
    assert!(
        d.until_log(DELETE_WAITS, 1, Duration::from_secs(10)).await,
        "the delete did not wait for the stream"
    );
    let (out, _) = d.exec("calm", "echo served").await;
    assert_eq!(out, "served\n");
    // Served while the delete still waits (not after it).
    assert!(!del.is_finished(), "the delete did not wait for the stream");
    let (s, v) = tokio::time::timeout(Duration::from_secs(15), del)
        .await
        .expect("the delete still waits for the download after 15 s")
        .unwrap();
    assert_eq!((s, v), (200, json!({"ok": true, "sandbox_id": "big"})));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    drop(body);
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 1, "{v}");
    assert!(cgroup_dirs(&dirs.cgroup_parent, Some("big")).is_empty());
}

/// SIGTERM with `stop_sandboxes_on_exit` stops every sandbox, each with a
/// download nobody reads, concurrently and in time.
#[tokio::test]
async fn sigterm_stops_sandboxes_with_stuck_downloads_in_time() {
    if !privileged("sigterm_stops_sandboxes_with_stuck_downloads_in_time") {
        return;
    }
    let dirs = NativeDirs::new();
    let config = dirs.root.path().join("config.toml");
    std::fs::write(&config, "shutdown_grace_seconds = 1\n").unwrap();
    let mut d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_CONFIG", config.to_str().unwrap()),
            ("SANDBOXD_DELETE_GRACE_SECONDS", "2"),
        ],
    );
    let mut held = Vec::new();
    for i in 0..3 {
        let id = format!("stop{i}");
        create(&d, ephemeral(&id)).await;
        let (_, code) = d.exec(&id, "truncate -s 50G /home/gem/huge.bin").await;
        assert_eq!(code, 0);
        let resp = proxied(
            &d,
            "GET",
            &format!("/api/sandboxes/{id}/proxy/v1/file/download?path=/home/gem/huge.bin"),
            None,
        )
        .await;
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "the daemon did not exit within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || sandbox_pids(&dirs).is_empty()),
        "sandbox processes left: {:?}",
        sandbox_pids(&dirs)
    );
    d.kill();
}
