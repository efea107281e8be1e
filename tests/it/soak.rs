//! Soak: many create → exec → file write/read → delete cycles against a real
//! native daemon, each with a proxied download cancelled half-way, and a
//! `kill -9` plus restart of the daemon every 100 cycles while one long-lived
//! sandbox stays up (and is adopted). Nothing may leak:
//!
//! - per daemon incarnation, from a baseline after warm-up (see
//!   [`WARM_UP`]) to its last cycle: the open fd count within ±2, RSS grown
//!   by less than 10 %;
//! - at the end (the long-lived sandbox deleted too): no sandbox process,
//!   no network namespace of one, no mount under the test's roots, no cgroup
//!   directory under the test's cgroup parent, no state directory.
//!
//! `SANDBOXD_SOAK_CYCLES` (default 300, CI's bounded form) sets the number
//! of cycles; the figures are printed (`--nocapture`) for
//! `docs/performance.md`. Heavy tier (`#[ignore]`): `cargo test --test it
//! -- --ignored`, which `.ci/run` runs after the fast tier.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{privileged, Daemon, NativeDirs, TOKEN};
use http_body_util::BodyExt;
use serde_json::json;

const RESTART_EVERY: usize = 100;
/// Cycles of each incarnation before its baseline is taken: the allocator's
/// arenas and the runtime's pools grow over the first creates and then stay
/// flat (one 400-cycle incarnation measured 26.5 MiB after 1 cycle, 27.8
/// after 50, 28.4 after 100, 28.7 from 175 to 400), so the leak check
/// compares the second half of each incarnation.
const WARM_UP: usize = 50;

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Processes in the test's cgroup parent (every sandbox process is).
fn sandbox_pids(dirs: &NativeDirs) -> BTreeSet<u32> {
    let needle = format!("/{}/", dirs.cgroup_parent);
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.contains(&needle)))
        })
        .collect()
}

/// What must be gone at the end: mounts under the test's roots, cgroup
/// directories under its parent, state directories.
fn leftovers(dirs: &NativeDirs, state: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let roots = [
        dirs.root.path().to_string_lossy().to_string(),
        state.to_string_lossy().to_string(),
    ];
    for l in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
    {
        let m = l.split_whitespace().nth(4).unwrap_or("");
        if roots.iter().any(|r| m.starts_with(r.as_str())) {
            out.push(format!("mount {m}"));
        }
    }
    for ctl in std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(|e| e.ok())
    {
        let parent = ctl.path().join(&dirs.cgroup_parent);
        for e in std::fs::read_dir(&parent)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
        {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(format!("cgroup {}", e.path().display()));
            }
        }
    }
    for e in std::fs::read_dir(state.join("sandboxes"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
    {
        out.push(format!("state {}", e.path().display()));
    }
    out
}

/// Starts a proxied download, reads its first frame and drops it.
async fn cancelled_download(d: &Daemon, id: &str) {
    let req = http::Request::builder()
        .method("GET")
        .uri(d.url(&format!(
            "/api/sandboxes/{id}/proxy/v1/file/download?path=/home/gem/user-data/big"
        )))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(common::full(Bytes::new()))
        .unwrap();
    let resp = d.client.request(req).await.expect("download");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first frame").expect("frame");
    assert!(first.data_ref().is_some_and(|b| !b.is_empty()));
    drop(body);
}

async fn cycle(d: &Daemon, n: usize) {
    let id = format!("soak{n}");
    let (s, v) = d
        .create(json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "workdir_path": "proj"}))
        .await;
    assert_eq!(s, 200, "create {id}: {v}");
    let (out, code) = d
        .exec(
            &id,
            "head -c 2097152 /dev/zero > /home/gem/user-data/big && echo ok",
        )
        .await;
    assert_eq!((out.as_str(), code), ("ok\n", 0), "exec in {id}");
    let content = format!("cycle {n}\n");
    let (s, v) = d
        .json(
            "POST",
            &format!("/api/sandboxes/{id}/proxy/v1/file/write"),
            Some(json!({"file": "/home/gem/user-data/proj/note", "content": content})),
        )
        .await;
    assert_eq!(s, 200, "write in {id}: {v}");
    let (s, v) = d
        .json(
            "POST",
            &format!("/api/sandboxes/{id}/proxy/v1/file/read"),
            Some(json!({"file": "/home/gem/user-data/proj/note"})),
        )
        .await;
    assert_eq!(s, 200, "read in {id}: {v}");
    assert_eq!(v["data"]["content"], content);
    cancelled_download(d, &id).await;
    let (s, v) = d
        .json("DELETE", &format!("/api/sandboxes/{id}"), None)
        .await;
    assert_eq!(s, 200, "delete {id}: {v}");
}

#[tokio::test]
#[ignore = "heavy tier: minutes of cycles; `cargo test --test it -- --ignored` (.ci/run runs it)"]
async fn soak_create_use_delete_restart_leaks_nothing() {
    if !privileged("soak_create_use_delete_restart_leaks_nothing") {
        return;
    }
    let cycles: usize = std::env::var("SANDBOXD_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dirs = NativeDirs::new();
    common::mkdir_user(&dirs.workspace("u1").join("proj"));
    let mut d = Daemon::start_native(&dirs, &[]);
    let (s, v) = d
        .create(json!({"sandbox_id": "keeper", "thread_id": "k", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let started = Instant::now();
    let mut baseline = None;
    let mut report = Vec::new();
    for n in 0..cycles {
        if n > 0 && n % RESTART_EVERY == 0 {
            // Close the incarnation's books, then crash and restart it.
            let (fd0, rss0) = baseline.take().expect("a baseline");
            let (fd1, rss1) = (fd_count(d.pid()), rss_kib(d.pid()));
            report.push((fd0, fd1, rss0, rss1));
            d.kill();
            let state = d.take_state_dir();
            drop(d);
            d = Daemon::start_native_in(&dirs, state, &[]);
            let (out, _) = d.exec("keeper", "echo adopted").await;
            assert_eq!(out, "adopted\n");
        }
        cycle(&d, n).await;
        if n % RESTART_EVERY == WARM_UP - 1 {
            baseline = Some((fd_count(d.pid()), rss_kib(d.pid())));
        }
    }
    if let Some((fd0, rss0)) = baseline {
        report.push((fd0, fd_count(d.pid()), rss0, rss_kib(d.pid())));
    }
    let (s, _) = d.json("DELETE", "/api/sandboxes/keeper", None).await;
    assert_eq!(s, 200);
    let elapsed = started.elapsed();
    eprintln!(
        "soak: {cycles} cycles in {:.1} s ({:.0} ms/cycle), restarts every {RESTART_EVERY}",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / cycles as f64
    );
    for (i, (fd0, fd1, rss0, rss1)) in report.iter().enumerate() {
        let growth = (*rss1 as f64 - *rss0 as f64) / *rss0 as f64 * 100.0;
        eprintln!(
            "soak: incarnation {i}: fds {fd0} -> {fd1}, RSS {rss0} KiB -> {rss1} KiB ({growth:+.1} %)"
        );
        assert!(
            fd1.abs_diff(*fd0) <= 2,
            "incarnation {i}: fds {fd0} -> {fd1}"
        );
        assert!(growth < 10.0, "incarnation {i}: RSS grew {growth:.1} %");
    }
    // Nothing of any sandbox remains (the exit of the last PID 1 and its
    // cgroup removal are synchronous with the delete).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = sandbox_pids(&dirs);
        let left = leftovers(&dirs, d.state_dir.path());
        if pids.is_empty() && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: processes {pids:?}, {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
