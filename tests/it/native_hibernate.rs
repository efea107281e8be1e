//! The hibernation ladder on the native backend (privileged): an idle
//! sandbox is frozen (and, with swap, reclaimed) and woken by the next
//! request with its processes, their memory, a listening server and their
//! output intact; a busy one is not frozen; concurrent requests share one
//! wake; a frozen sandbox is deleted like an active one, leaving nothing;
//! a `kill -9` of the daemon while one is frozen, a restart and a request:
//! it answers. With a swap of the test's own (zram, heavy tier: it changes
//! the host's swap): a reclaimed sandbox wakes intact with its limits and
//! OOM counter working, and a reclaim that cannot finish (swap full)
//! leaves the sandbox frozen, says why, and kills nothing.
//!
//! The ladder runs on the host's cgroups (v1 freezer and memory on a
//! hybrid host; v2 `cgroup.freeze` and `memory.reclaim` on a pure v2 one).
//! Barriers: the list's `idle.state` (read without waking), the metrics
//! and the daemon's log lines, polled with a deadline.

use crate::common;
use crate::native_durability::{assert_no_leak, snapshot};

use std::time::{Duration, Instant};

use common::{cannot_run, privileged, Daemon, NativeDirs};
use serde_json::{json, Value};

/// A ladder that steps down at once: checks every second, freeze after
/// 1 s idle, reclaim after 2 s.
const FAST: &[(&str, &str)] = &[
    ("SANDBOX_IDLE_CHECK_INTERVAL_SECONDS", "1"),
    ("SANDBOXD_IDLE_FREEZE_SECONDS", "1"),
    ("SANDBOXD_IDLE_RECLAIM_SECONDS", "2"),
];

/// The idle state of `id` as the list shows it (no wake).
async fn idle_state(d: &Daemon, id: &str) -> String {
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(s, 200, "{v}");
    let sb = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sandbox_id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {v}"))
        .clone();
    assert_eq!(sb["status"], "running", "{sb}");
    sb["idle"]["state"].as_str().unwrap_or("").to_string()
}

/// Waits (at most 60 s) until `id` is in `state`.
async fn wait_state(d: &Daemon, id: &str, state: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let now = idle_state(d, id).await;
        if now == state {
            return;
        }
        assert!(Instant::now() < end, "{id} never {state}: still {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metrics(d: &Daemon) -> String {
    let (s, _, body) = d.call("GET", "/metrics", None, None).await;
    assert_eq!(s, 200);
    String::from_utf8_lossy(&body).to_string()
}

/// Wakes counted from `from` (`frozen`, `reclaimed`).
async fn wakes(d: &Daemon, from: &str) -> f64 {
    let series = format!("sandboxd_wake_duration_seconds_count{{from=\"{from}\"}}");
    metric(&metrics(d).await, &series)
}

/// The value of the metric line starting with `series`, or 0.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A file of the sandbox's cgroup: in `controller`'s hierarchy (v1,
/// hybrid), or in its v2 directory.
fn cgroup_file(dirs: &NativeDirs, id: &str, controller: &str, file: &str) -> std::path::PathBuf {
    let v1 = std::path::Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(&dirs.cgroup_parent)
        .join(id);
    if v1.is_dir() {
        return v1.join(file);
    }
    std::path::Path::new("/sys/fs/cgroup")
        .join(&dirs.cgroup_parent)
        .join(id)
        .join(file)
}

/// Memory and swap limits as the host reads them: v1 memory and
/// memory+swap, v2 `memory.max` and `memory.swap.max`.
fn limits(dirs: &NativeDirs, id: &str) -> Vec<String> {
    let read = |controller: &str, v1: &str, v2: &str| {
        std::fs::read_to_string(cgroup_file(dirs, id, controller, v1))
            .or_else(|_| std::fs::read_to_string(cgroup_file(dirs, id, "", v2)))
            .unwrap()
            .trim()
            .to_string()
    };
    vec![
        read("memory", "memory.limit_in_bytes", "memory.max"),
        read("memory", "memory.memsw.limit_in_bytes", "memory.swap.max"),
    ]
}

/// The memory charged to the sandbox's cgroup, in bytes.
fn usage(dirs: &NativeDirs, id: &str) -> u64 {
    std::fs::read_to_string(cgroup_file(dirs, id, "memory", "memory.usage_in_bytes"))
        .or_else(|_| std::fs::read_to_string(cgroup_file(dirs, id, "", "memory.current")))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// What the kernel says of the sandbox's freezer (read from its file).
fn frozen_in_kernel(dirs: &NativeDirs, id: &str) -> bool {
    let v1 = cgroup_file(dirs, id, "freezer", "freezer.state");
    match std::fs::read_to_string(&v1) {
        Ok(s) => s.trim() == "FROZEN",
        Err(_) => std::fs::read_to_string(cgroup_file(dirs, id, "", "cgroup.events"))
            .unwrap_or_default()
            .lines()
            .any(|l| l == "frozen 1"),
    }
}

/// A Python process with `mib` MiB of live heap (a list of dicts of
/// random strings), a TCP server on 127.0.0.1:9000 that answers the heap's
/// checksum, and its start written to /tmp/started before it serves.
fn holder_script(mib: usize) -> String {
    format!(
        "import hashlib, os, socket\n\
         n = {mib} * 1024 * 1024 // 150\n\
         data = [{{'id': i, 'name': os.urandom(24).hex(), 'score': i * 0.5, 'tags': ['a', 'b']}} for i in range(n)]\n\
         def digest():\n\
         \x20   h = hashlib.sha256()\n\
         \x20   for d in data:\n\
         \x20       h.update(d['name'].encode()); h.update(str(d['score']).encode())\n\
         \x20   return h.hexdigest()\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', 9000)); s.listen(8)\n\
         open('/tmp/started', 'w').write(digest())\n\
         while True:\n\
         \x20   c, _ = s.accept(); c.sendall(digest().encode()); c.close()\n"
    )
}

/// Asks the holder's server for its heap's checksum.
const ASK: &str = "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 9000)); print(s.recv(100).decode())\"";

/// Starts the holder in `id` (its script in the user's workspace), writes
/// a note to /tmp before any freeze, and returns the heap's checksum.
async fn start_holder(d: &Daemon, dirs: &NativeDirs, uid: &str, id: &str, mib: usize) -> String {
    std::fs::write(dirs.workspace(uid).join("hold.py"), holder_script(mib)).unwrap();
    let (out, code) = d
        .exec(
            id,
            "nohup python3 /home/gem/user-data/hold.py >/dev/null 2>&1 & \
             for i in $(seq 600); do [ -s /tmp/started ] && break; sleep 0.1; done; \
             echo before-the-freeze > /tmp/note; cat /tmp/started",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.len(), 64, "the holder did not start: {out:?}");
    out
}

/// Asks `id` (waking it) for the note written before the freeze and the
/// holder's checksum; asserts both.
async fn assert_intact(d: &Daemon, id: &str, sum: &str) {
    let (out, code) = d.exec(id, &format!("cat /tmp/note; {ASK}")).await;
    assert_eq!((out, code), (format!("before-the-freeze\n{sum}\n"), 0));
}

/// One zram swap at a time: the tests that set one up share the node's
/// zram0.
static ZRAM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A zram swap of `mib` MiB (lz4) for the test, removed when dropped;
/// `None` when the node has swap already or no usable zram0.
struct Zram(#[allow(dead_code)] tokio::sync::MutexGuard<'static, ()>);

impl Zram {
    async fn setup(mib: u64) -> Option<Zram> {
        let one = ZRAM.lock().await;
        let sh = |c: &str| {
            std::process::Command::new("sh")
                .args(["-c", c])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !std::path::Path::new("/sys/block/zram0").exists() {
            sh("modprobe zram");
        }
        let size = std::fs::read_to_string("/sys/block/zram0/disksize").ok()?;
        if size.trim() != "0" || std::fs::read_to_string("/proc/swaps").ok()?.lines().count() > 1 {
            return None;
        }
        let zram = Zram(one);
        let ok = sh(&format!(
            "echo lz4 > /sys/block/zram0/comp_algorithm; echo {mib}M > /sys/block/zram0/disksize && \
             mkswap /dev/zram0 >/dev/null && swapon /dev/zram0"
        ));
        ok.then_some(zram)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::process::Command::new("sh")
            .args([
                "-c",
                "swapoff /dev/zram0 2>/dev/null; echo 1 > /sys/block/zram0/reset",
            ])
            .status();
    }
}

/// A zram swap of `mib` MiB, then a daemon with `env` (user `u1`'s
/// workspace made); `None` (the test returns) when not root or the zram
/// cannot be had, said loudly.
async fn with_zram(mib: u64, env: &[(&str, &str)]) -> Option<(Zram, NativeDirs, Daemon)> {
    let test = common::test_name();
    if !privileged(&test) {
        return None;
    }
    let Some(zram) = Zram::setup(mib).await else {
        cannot_run(&format!("{test}: the node has swap, or no usable zram0"));
        return None;
    };
    let dirs = NativeDirs::new();
    common::mkdir_user(&dirs.workspace("u1"));
    let d = Daemon::start_native(&dirs, env);
    Some((zram, dirs, d))
}

/// Frozen at 1 s idle, a sandbox keeps its process, its memory (the
/// heap's checksum), a listening server and the output it wrote before:
/// a request wakes it; so does a discover. Its limits are as before, the
/// record and `state.json` say where it is, `status` stays `running`.
#[tokio::test]
async fn a_frozen_sandbox_wakes_with_its_processes_memory_server_and_output() {
    if !privileged("a_frozen_sandbox_wakes_with_its_processes_memory_server_and_output") {
        return;
    }
    let dirs = NativeDirs::new();
    common::mkdir_user(&dirs.workspace("u1"));
    let d = Daemon::start_native(&dirs, FAST);
    let (s, v) = d
        .create(json!({"sandbox_id":"frz","thread_id":"t","uid":"u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["idle"]["state"], "active", "{v}");
    let sum = start_holder(&d, &dirs, "u1", "frz", 8).await;
    let limits_before = limits(&dirs, "frz");

    wait_state(&d, "frz", "frozen").await;
    assert!(frozen_in_kernel(&dirs, "frz"));
    assert_eq!(d.sandbox_state("frz")["idle"]["state"], "frozen");
    let m = metrics(&d).await;
    assert_eq!(
        metric(&m, "sandboxd_sandboxes{idle_state=\"frozen\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "sandboxd_idle_steps_total{step=\"freeze\"}"),
        1.0
    );

    assert_intact(&d, "frz", &sum).await;
    assert!(!frozen_in_kernel(&dirs, "frz"));
    assert_eq!(limits(&dirs, "frz"), limits_before);
    assert_eq!(wakes(&d, "frozen").await, 1.0);

    // Down again; a discover wakes it and answers it awake.
    wait_state(&d, "frz", "frozen").await;
    let (s, v) = d.json("GET", "/api/sandboxes/frz", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["idle"]["state"], "active", "{v}");
    assert!(!frozen_in_kernel(&dirs, "frz"));
    assert_intact(&d, "frz", &sum).await;
}

#[tokio::test]
async fn a_busy_sandbox_is_not_frozen() {
    if !privileged("a_busy_sandbox_is_not_frozen") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, FAST);
    let (s, v) = d
        .create(json!({"sandbox_id":"busy","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{v}");
    d.exec(
        "busy",
        "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > /tmp/spin",
    )
    .await;
    // Several rounds found it due by its requests, and busy.
    let refused = "sandboxd_idle_steps_refused_total{step=\"freeze\",reason=\"cpu\"}";
    let end = Instant::now() + Duration::from_secs(60);
    while metric(&metrics(&d).await, refused) < 3.0 {
        assert!(Instant::now() < end, "never refused as busy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(idle_state(&d, "busy").await, "active");
    assert!(!frozen_in_kernel(&dirs, "busy"));
    // Once the job ends, it is frozen.
    d.exec("busy", "kill $(cat /tmp/spin)").await;
    wait_state(&d, "busy", "frozen").await;
}

#[tokio::test]
async fn concurrent_requests_share_one_wake_and_a_frozen_sandbox_deletes_cleanly() {
    if !privileged("concurrent_requests_share_one_wake_and_a_frozen_sandbox_deletes_cleanly") {
        return;
    }
    let dirs = NativeDirs::new();
    let state = tempfile::tempdir().unwrap();
    let before = snapshot(&dirs, state.path(), None);
    let d = Daemon::start_native_in(&dirs, state, FAST);
    let (s, v) = d
        .create(json!({"sandbox_id":"many","thread_id":"t","uid":"u1","inherit_env":false}))
        .await;
    assert_eq!(s, 200, "{v}");
    wait_state(&d, "many", "frozen").await;
    let reqs = (0..8).map(|i| {
        let d = &d;
        async move { d.exec("many", &format!("echo {i}")).await }
    });
    let outs = futures_util::future::join_all(reqs).await;
    for (i, (out, code)) in outs.into_iter().enumerate() {
        assert_eq!((out, code), (format!("{i}\n"), 0));
    }
    assert_eq!(
        wakes(&d, "frozen").await,
        1.0,
        "one thaw for eight requests"
    );
    // A frozen sandbox's delete: no wait for a thaw, nothing left behind.
    wait_state(&d, "many", "frozen").await;
    let g = v["generation"].as_str().unwrap();
    let (s, body) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/many?expected_generation={g}"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert!(
        !d.log_contains("did not exit after SIGKILL"),
        "the delete waited for a thaw"
    );
    assert_no_leak(
        &dirs,
        d.state_dir.path(),
        Some(d.pid()),
        &before,
        "after the delete of a frozen sandbox",
    );
}

#[tokio::test]
async fn a_frozen_sandbox_survives_kill_9_and_answers_after_the_restart() {
    if !privileged("a_frozen_sandbox_survives_kill_9_and_answers_after_the_restart") {
        return;
    }
    let dirs = NativeDirs::new();
    common::mkdir_user(&dirs.workspace("u1"));
    let mut d = Daemon::start_native(&dirs, FAST);
    let (s, v) = d
        .create(json!({"sandbox_id":"k9","thread_id":"t","uid":"u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let sum = start_holder(&d, &dirs, "u1", "k9", 8).await;
    wait_state(&d, "k9", "frozen").await;
    d.kill();
    let state = d.take_state_dir();
    drop(d);
    assert!(frozen_in_kernel(&dirs, "k9"), "frozen with no daemon");
    // Adopted frozen (no ladder now: the state comes from the record).
    let d = Daemon::start_native_in(&dirs, state, &[]);
    assert_eq!(idle_state(&d, "k9").await, "frozen");
    assert_intact(&d, "k9", &sum).await;
    assert_eq!(idle_state(&d, "k9").await, "active");
    assert!(!frozen_in_kernel(&dirs, "k9"));
    // Its record says active again (written behind the request).
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let rec: Value = d.sandbox_state("k9");
        if rec.get("idle").is_none() {
            break;
        }
        assert!(Instant::now() < end, "record still says asleep: {rec}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reclaimed to a zram swap, a sandbox's cgroup holds less than a quarter
/// of what it held active (the goal); a request wakes it with
/// its heap intact; its limits are as before and its OOM counter works
/// (a hog above its limit is killed and counted, the holder survives).
#[tokio::test]
#[ignore = "heavy tier: sets up a zram swap on the host; `cargo test --test it -- --ignored` (.ci/run runs it)"]
async fn a_reclaimed_sandbox_wakes_intact_and_its_limits_and_oom_counter_hold() {
    let Some((zram, dirs, d)) = with_zram(512, FAST).await else {
        return;
    };
    let (s, v) = d
        .create(json!({"sandbox_id":"hib","thread_id":"t","uid":"u1",
                       "resources":{"memory_mb":512}}))
        .await;
    assert_eq!(s, 200, "{v}");
    let sum = start_holder(&d, &dirs, "u1", "hib", 40).await;
    let active = usage(&dirs, "hib");
    let limits_before = limits(&dirs, "hib");
    assert!(
        limits_before[0] == limits_before[1] || limits_before[1] == "0",
        "the sandbox may swap: {limits_before:?}"
    );

    wait_state(&d, "hib", "reclaimed").await;
    assert!(frozen_in_kernel(&dirs, "hib"), "the reclaim thawed it");
    assert_eq!(d.sandbox_state("hib")["idle"]["state"], "reclaimed");
    let reclaimed = usage(&dirs, "hib");
    println!("cgroup: active {active} bytes, reclaimed {reclaimed}");
    assert!(
        reclaimed * 4 <= active,
        "cgroup {reclaimed} of {active} bytes after the reclaim"
    );
    let m = metrics(&d).await;
    assert!(metric(&m, "sandboxd_reclaimed_bytes_total") > 0.0, "{m}");
    assert_eq!(
        metric(&m, "sandboxd_sandboxes{idle_state=\"reclaimed\"}"),
        1.0,
        "{m}"
    );

    assert_intact(&d, "hib", &sum).await;
    assert!(!frozen_in_kernel(&dirs, "hib"));
    assert_eq!(wakes(&d, "reclaimed").await, 1.0);
    assert_eq!(limits(&dirs, "hib"), limits_before);
    // A hog the OOM killer picks over the holder (larger when the limit
    // is reached).
    let (out, _) = d
        .exec("hib", "python3 -c 'b = b\"x\" * (800 << 20)'; echo rc=$?")
        .await;
    assert!(out.contains("rc=137"), "the hog was not SIGKILLed: {out}");
    let (s, v) = d.json("GET", "/api/sandboxes/hib", None).await;
    assert_eq!((s, &v["oom_killed"]), (200, &json!(true)), "{v}");
    assert_intact(&d, "hib", &sum).await;
    drop(d);
    drop(zram);
}

/// A swap too small for the sandbox's anonymous memory: the reclaim does
/// not finish, the sandbox stays frozen (nothing OOM-killed), the log and
/// `sandboxd_reclaim_failures_total{reason="swap_full"}` say why, it is
/// tried again a reclaim interval later, and a request wakes it intact.
#[tokio::test]
#[ignore = "heavy tier: sets up a zram swap on the host; `cargo test --test it -- --ignored` (.ci/run runs it)"]
async fn a_reclaim_that_cannot_finish_leaves_the_sandbox_frozen() {
    let Some((zram, dirs, d)) = with_zram(8, FAST).await else {
        return;
    };
    let (s, v) = d
        .create(json!({"sandbox_id":"full","thread_id":"t","uid":"u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let sum = start_holder(&d, &dirs, "u1", "full", 40).await;
    let failed = "sandboxd_reclaim_failures_total{reason=\"swap_full\"}";
    let end = Instant::now() + Duration::from_secs(60);
    while metric(&metrics(&d).await, failed) < 1.0 {
        assert!(Instant::now() < end, "no reclaim failure counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.log_contains("reclaim did not finish"));
    assert_eq!(idle_state(&d, "full").await, "frozen");
    assert!(frozen_in_kernel(&dirs, "full"));
    // Tried again a reclaim interval later, and refused again: frozen
    // throughout, the holder intact.
    while metric(&metrics(&d).await, failed) < 2.0 {
        assert!(
            Instant::now() < end,
            "the failed reclaim was not tried again"
        );
        assert_eq!(idle_state(&d, "full").await, "frozen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(frozen_in_kernel(&dirs, "full"));
    assert_intact(&d, "full", &sum).await;
    drop(d);
    drop(zram);
}
