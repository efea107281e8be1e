//! Per-sandbox cgroups seen from the outside, on real sandboxes
//! (privileged): a fork bomb stops at the pids limit, a memory hog is
//! OOM-killed but the agent survives and the kill is reported (also at
//! once among many sandboxes), a CPU
//! spinner is held to its quota, `/tmp` stops at its size cap without
//! touching the host's disk and is charged to the memory limit, per-request
//! resources reach the kernel, and no cgroup outlives its sandbox (delete,
//! failed create, daemon restart over orphans).
//!
//! Every daemon gets its own cgroup parent (`NativeDirs::cgroup_parent`),
//! so the checks below only ever look under it.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{children_of, privileged, Daemon, NativeDirs};
use sandboxd::cgroups::{CgroupRoot, SandboxCgroup};
use serde_json::{json, Value};

const CG: &str = "/sys/fs/cgroup";

/// The daemon's view of the test's cgroup parent; prints the layout.
fn cgroup_root(dirs: &NativeDirs) -> CgroupRoot {
    let root = CgroupRoot::detect(&dirs.cgroup_parent).expect("detect the cgroup layout");
    println!("cgroup layout: {}", root.layout());
    root
}

fn open(root: &CgroupRoot, id: &str) -> SandboxCgroup {
    root.open(id)
        .unwrap()
        .unwrap_or_else(|| panic!("sandbox {id} has no cgroup"))
}

/// `<hierarchy>/<parent>[/<sub>]` in every hierarchy mounted under
/// /sys/fs/cgroup (v2 at the top, v1 one per controller), where it exists.
pub(crate) fn cgroup_dirs(parent: &str, sub: Option<&str>) -> Vec<PathBuf> {
    let mut bases = vec![PathBuf::from(CG)];
    bases.extend(
        std::fs::read_dir(CG)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir()),
    );
    bases
        .into_iter()
        .map(|b| match sub {
            Some(s) => b.join(parent).join(s),
            None => b.join(parent),
        })
        .filter(|p| p.is_dir())
        .collect()
}

/// Every cgroup directory under the test's parent, in any hierarchy.
fn cgroups_under(parent: &str) -> Vec<PathBuf> {
    cgroup_dirs(parent, None)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().filter_map(|e| e.ok()))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// Host pids whose cgroup (in any hierarchy) is the sandbox's or below it.
fn procs_in(parent: &str, id: &str) -> Vec<i32> {
    let tail = format!("/{parent}/{id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.ends_with(&tail) || l.contains(&format!("{tail}/")))
        })
        .collect()
}

/// An interface file of sandbox `id`: `v1` in the v1 `controller`, `v2`
/// in the unified hierarchy.
fn cg_file(
    root: &CgroupRoot,
    parent: &str,
    id: &str,
    controller: &str,
    v1: &str,
    v2: &str,
) -> PathBuf {
    if root.layout().uses_v1() {
        Path::new(CG)
            .join(controller)
            .join(parent)
            .join(id)
            .join(v1)
    } else {
        Path::new(CG).join(parent).join(id).join(v2)
    }
}

fn read_u64(p: &Path) -> u64 {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: {s:?}", p.display()))
}

/// `key N` from a flat-keyed file (`pids.events`, `memory.events`).
fn keyed(p: &Path, key: &str) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}", p.display()))
}

/// Highest memory usage the sandbox's cgroup ever had, in bytes.
fn memory_peak(root: &CgroupRoot, parent: &str, id: &str) -> u64 {
    read_u64(&cg_file(
        root,
        parent,
        id,
        "memory",
        "memory.max_usage_in_bytes",
        "memory.peak",
    ))
}

async fn create(d: &Daemon, id: &str, resources: Value) -> Value {
    let (s, v) = d
        .create(json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "resources": resources}))
        .await;
    assert_eq!(s, 200, "create {id}: {v}");
    v
}

async fn delete(d: &Daemon, id: &str) {
    let (s, v) = d
        .json("DELETE", &format!("/api/sandboxes/{id}"), None)
        .await;
    assert_eq!(s, 200, "delete {id}: {v}");
}

/// Starts `cmd` in the background inside `id` (exec's `async_mode`).
async fn exec_async(d: &Daemon, id: &str, cmd: &str) {
    let (s, v) = d
        .json(
            "POST",
            &format!("/api/sandboxes/{id}/proxy/v1/shell/exec"),
            Some(json!({"command": cmd, "async_mode": true, "hard_timeout": 170})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["data"]["status"], "running", "{v}");
}

/// Writes a config file under the test's root; returns its path.
fn config_file(dirs: &NativeDirs, toml: &str) -> String {
    let p = dirs.root.path().join("sandboxd.toml");
    std::fs::write(&p, toml).unwrap();
    p.to_string_lossy().to_string()
}

/// Asserts the sandbox left nothing: no process in its cgroup, no cgroup
/// directory in any hierarchy, no state directory.
fn assert_gone(d: &Daemon, dirs: &NativeDirs, id: &str) {
    let procs = procs_in(&dirs.cgroup_parent, id);
    assert!(procs.is_empty(), "processes of {id} left: {procs:?}");
    let left = cgroup_dirs(&dirs.cgroup_parent, Some(id));
    assert!(left.is_empty(), "cgroups of {id} left: {left:?}");
    let state = d.state_dir.path().join("sandboxes").join(id);
    assert!(!state.exists(), "{} left", state.display());
}

async fn list(d: &Daemon) -> Vec<Value> {
    let (s, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(s, 200, "{v}");
    v["sandboxes"].as_array().unwrap().clone()
}

#[tokio::test]
async fn fork_bomb_stops_at_pids_limit_and_the_node_keeps_answering() {
    if !privileged("fork_bomb_stops_at_pids_limit_and_the_node_keeps_answering") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    let parent = dirs.cgroup_parent.as_str();
    create(&d, "bomb", json!({"pids": 64})).await;
    create(&d, "calm", Value::Null).await;

    exec_async(&d, "bomb", ":(){ :|:& };:").await;
    let current = cg_file(
        &root,
        parent,
        "bomb",
        "pids",
        "pids.current",
        "pids.current",
    );
    let events = cg_file(&root, parent, "bomb", "pids", "pids.events", "pids.events");
    let start = Instant::now();
    let mut peak = 0;
    while keyed(&events, "max") == 0 {
        let n = read_u64(&current);
        peak = peak.max(n);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the bomb never hit the limit (pids.current {n})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // While the bomb pushes against the limit, everything else answers.
    for round in 0..5 {
        let n = read_u64(&current);
        peak = peak.max(n);
        assert!(n <= 64, "pids.current {n} over the limit");
        let t = Instant::now();
        let (s, v) = d.json("GET", "/health", None).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(list(&d).await.len(), 2);
        let (out, code) = d.exec("calm", "echo ok").await;
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        println!(
            "round {round}: bomb at {n} pids, health+list+exec in {:?}",
            t.elapsed()
        );
        assert!(t.elapsed() < Duration::from_secs(10), "node too slow");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused = keyed(&events, "max");
    println!("fork bomb: peak {peak} pids (limit 64), {refused} forks refused");
    assert!((32..=64).contains(&peak), "peak {peak}");

    delete(&d, "bomb").await;
    assert_gone(&d, &dirs, "bomb");
    let (out, _) = d.exec("calm", "echo still").await;
    assert_eq!(out, "still\n");
    delete(&d, "calm").await;
    assert_gone(&d, &dirs, "calm");
    assert_eq!(cgroups_under(parent), Vec::<PathBuf>::new());
    assert_eq!(children_of(d.pid()), 0);
}

#[tokio::test]
async fn memory_hog_is_oom_killed_and_the_agent_survives() {
    if !privileged("memory_hog_is_oom_killed_and_the_agent_survives") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    let parent = dirs.cgroup_parent.as_str();
    create(&d, "hog", json!({"memory_mb": 128})).await;

    // The agent is protected from the OOM killer, its commands are not:
    // every command runs 500 points above the agent's score.
    let (out, _) = d
        .exec("hog", "cat /proc/1/oom_score_adj /proc/self/oom_score_adj")
        .await;
    let scores: Vec<i32> = out.lines().map(|l| l.parse().unwrap()).collect();
    let (agent, command) = (scores[0], scores[1]);
    println!("oom_score_adj: agent {agent}, command {command}");
    assert_eq!(command, (agent + 500).clamp(0, 1000));
    assert!(command > agent, "{out}");

    let (out, _) = d
        .exec("hog", "python3 -c 'b = b\"x\" * (400 << 20)'; echo rc=$?")
        .await;
    println!("memory hog: {out:?}");
    assert!(out.contains("rc=137"), "the hog was not SIGKILLed: {out}");
    let cg = open(&root, "hog");
    assert!(cg.oom_kills() >= 1, "no OOM kill counted by the kernel");
    let peak = memory_peak(&root, parent, "hog");
    println!("memory peak {} MiB (limit 128 MiB)", peak >> 20);
    assert!(peak <= 128 << 20, "peak {peak}");

    // The agent (PID 1) survived: the sandbox still works.
    let (out, code) = d.exec("hog", "echo alive; cat /proc/1/oom_score_adj").await;
    assert_eq!((out, code), (format!("alive\n{agent}\n"), 0));

    let (s, v) = d.json("GET", "/api/sandboxes/hog", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["oom_killed"], true, "discover: {v}");
    assert_eq!(v["status"], "running", "{v}");
    let listed = list(&d).await;
    assert_eq!(listed[0]["oom_killed"], true, "list: {listed:?}");

    let (s, _, body) = d.call("GET", "/metrics", None, None).await;
    assert_eq!(s, 200);
    let text = String::from_utf8_lossy(&body);
    let kills: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_oom_kills_total ")?.parse().ok())
        .unwrap_or_else(|| panic!("no sandboxd_oom_kills_total in:\n{text}"));
    println!("sandboxd_oom_kills_total {kills}");
    assert!(kills >= 1.0);

    delete(&d, "hog").await;
    assert_gone(&d, &dirs, "hog");
}

/// `oom_killed` is right at once among more sandboxes than a list reads
/// directly (the native backend reads their OOM counters only after the
/// node-wide count in `/proc/vmstat` moved): a list taken before the kill
/// (nothing to report, the count remembered), then the kill, then a list
/// and a discover right after the command's status came back, for a kill
/// in one sandbox, then in a second one, then in a third by a command in
/// the background, listed as soon as its cgroup counted the kill.
#[tokio::test]
async fn oom_kills_are_listed_at_once_among_many_sandboxes() {
    if !privileged("oom_kills_are_listed_at_once_among_many_sandboxes") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    let node_count = std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("oom_kill "));
    let gate_line = if node_count {
        "list reads the sandboxes' counters only after the node-wide oom_kill count"
    } else {
        "every list reads the OOM counter of every live sandbox"
    };
    assert!(d.log_contains(gate_line), "no log line {gate_line:?}");
    let ids: Vec<String> = (0..7).map(|i| format!("many{i}")).collect();
    for id in &ids {
        create(&d, id, json!({"memory_mb": 128})).await;
    }
    let flagged = |listed: &[Value]| -> Vec<String> {
        listed
            .iter()
            .filter(|v| v["oom_killed"] == true)
            .map(|v| v["sandbox_id"].as_str().unwrap().to_string())
            .collect()
    };
    for _ in 0..3 {
        let listed = list(&d).await;
        assert_eq!(listed.len(), ids.len());
        assert_eq!(flagged(&listed), Vec::<String>::new(), "{listed:?}");
    }
    let hog = "python3 -c 'b = b\"x\" * (400 << 20)'; echo rc=$?";
    let mut expected = Vec::new();
    for id in ["many1", "many4"] {
        let (out, _) = d.exec(id, hog).await;
        assert!(
            out.contains("rc=137"),
            "{id}: the hog was not SIGKILLed: {out}"
        );
        expected.push(id.to_string());
        let listed = list(&d).await;
        assert_eq!(flagged(&listed), expected, "list right after {id}'s kill");
        let (s, v) = d.json("GET", &format!("/api/sandboxes/{id}"), None).await;
        assert_eq!((s, &v["oom_killed"]), (200, &json!(true)), "{v}");
        // And the lists after it (no kill since: nothing read again).
        assert_eq!(flagged(&list(&d).await), expected);
    }
    // A kill nobody is told about: listed once the cgroup counted it.
    exec_async(&d, "many6", hog).await;
    let cg = open(&root, "many6");
    let end = Instant::now() + Duration::from_secs(60);
    while cg.oom_kills() == 0 {
        assert!(
            Instant::now() < end,
            "the background hog was not OOM-killed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    expected.push("many6".to_string());
    assert_eq!(
        flagged(&list(&d).await),
        expected,
        "list right after the kill"
    );
    for id in &ids {
        let (s, v) = d.json("GET", &format!("/api/sandboxes/{id}"), None).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["status"], "running", "{v}");
    }
    let (s, _, body) = d.call("GET", "/metrics", None, None).await;
    assert_eq!(s, 200);
    let text = String::from_utf8_lossy(&body);
    let kills: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sandboxd_oom_kills_total ")?.parse().ok())
        .unwrap_or_else(|| panic!("no sandboxd_oom_kills_total in:\n{text}"));
    assert_eq!(kills, 3.0, "one per sandbox that reported a kill");
    for id in &ids {
        delete(&d, id).await;
        assert_gone(&d, &dirs, id);
    }
}

#[tokio::test]
async fn cpu_spinner_is_held_to_its_quota() {
    if !privileged("cpu_spinner_is_held_to_its_quota") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    create(&d, "spin", json!({"cpus": 0.5})).await;
    let cg = open(&root, "spin");
    assert_eq!(cg.limits().unwrap().cpu_quota_usec, Some(50_000));

    // Two spinners: without the quota they would take both CPUs.
    let used0 = cg.cpu_usage_usec().unwrap();
    let t0 = Instant::now();
    let (_, code) = d
        .exec(
            "spin",
            "for i in 1 2; do timeout 5 sh -c 'while :; do :; done' & done; wait",
        )
        .await;
    let wall = t0.elapsed();
    let used = cg.cpu_usage_usec().unwrap() - used0;
    assert_eq!(code, 0);
    let ratio = used as f64 / wall.as_micros() as f64;
    println!(
        "cpu: {:.3} s of CPU in {:.3} s wall = {ratio:.3} CPUs (quota 0.5)",
        used as f64 / 1e6,
        wall.as_secs_f64()
    );
    assert!(ratio <= 0.65, "over the quota: {ratio:.3}");
    assert!(ratio >= 0.2, "the spinners barely ran: {ratio:.3}");
    delete(&d, "spin").await;
    assert_gone(&d, &dirs, "spin");
}

/// Every regular file of at least `min` bytes under `dir` (not following
/// symlinks, not crossing into other filesystems' mounts from here).
fn big_files(dir: &Path, min: u64, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let Ok(md) = e.path().symlink_metadata() else {
            continue;
        };
        if md.is_dir() {
            big_files(&e.path(), min, out);
        } else if md.is_file() && md.len() >= min {
            out.push(e.path());
        }
    }
}

fn free_bytes(p: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(p).unwrap();
    st.blocks_available() as u64 * st.fragment_size() as u64
}

#[tokio::test]
async fn tmp_stops_at_its_cap_without_host_disk() {
    if !privileged("tmp_stops_at_its_cap_without_host_disk") {
        return;
    }
    let dirs = NativeDirs::new();
    let cfg = config_file(&dirs, "[limits]\ntmp_size_mb = 32\n");
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_CONFIG", &cfg)]);
    create(&d, "tmpcap", Value::Null).await;
    let (out, _) = d
        .exec(
            "tmpcap",
            "stat -f -c %T /tmp; df -k /tmp | awk 'NR==2 {print $2}'",
        )
        .await;
    assert_eq!(out, "tmpfs\n32768\n");

    let free0 = free_bytes(d.state_dir.path());
    let (out, _) = d
        .exec(
            "tmpcap",
            "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; echo rc=$?; stat -c %s /tmp/fill",
        )
        .await;
    println!("/tmp fill: {out:?}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(out.contains("rc=1"), "{out}");
    let size: u64 = out.lines().last().unwrap().parse().unwrap();
    assert!(
        (30 << 20..=32 << 20).contains(&size),
        "{size} bytes written, cap is 32 MiB"
    );
    let free1 = free_bytes(d.state_dir.path());
    let used = free0.saturating_sub(free1);
    println!(
        "host filesystem of the state dir: {} KiB less free after filling /tmp",
        used >> 10
    );
    assert!(used < 16 << 20, "{used} bytes of host disk used");
    let mut big = Vec::new();
    big_files(d.state_dir.path(), 1 << 20, &mut big);
    big_files(dirs.root.path(), 1 << 20, &mut big);
    assert!(big.is_empty(), "the bytes landed on the host: {big:?}");

    delete(&d, "tmpcap").await;
    assert_gone(&d, &dirs, "tmpcap");
}

#[tokio::test]
async fn tmpfs_pages_count_against_the_memory_limit() {
    if !privileged("tmpfs_pages_count_against_the_memory_limit") {
        return;
    }
    let dirs = NativeDirs::new();
    let cfg = config_file(&dirs, "[limits]\ntmp_size_mb = 512\n");
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_CONFIG", &cfg)]);
    let root = cgroup_root(&dirs);
    let parent = dirs.cgroup_parent.as_str();
    create(&d, "tmpmem", json!({"memory_mb": 128})).await;

    let agent = procs_in(parent, "tmpmem")
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .starts_with(b"/.sandboxd/sandbox-agent")
        })
        .expect("agent pid");
    let (out, code) = d
        .exec(
            "tmpmem",
            "dd if=/dev/zero of=/tmp/fill bs=1M count=300 2>&1; echo rc=$?",
        )
        .await;
    // Seen from the host, through the agent's mount namespace.
    let fill = PathBuf::from(format!("/proc/{agent}/root/tmp/fill"));
    let size = std::fs::metadata(&fill).map(|m| m.len()).unwrap_or(0);
    let cg = open(&root, "tmpmem");
    let peak = memory_peak(&root, parent, "tmpmem");
    println!(
        "300 MiB into /tmp with 128 MiB of memory: exit {code}, output {out:?}, \
         {} MiB in /tmp, {} OOM kills, memory peak {} MiB",
        size >> 20,
        cg.oom_kills(),
        peak >> 20
    );
    assert!(
        !out.contains("rc=0") && code != 0,
        "the write succeeded: {out}"
    );
    assert!(
        size < 128 << 20,
        "{size} bytes in /tmp over the memory limit"
    );
    assert!(peak <= 128 << 20, "memory peak {peak} over the limit");
    assert!(cg.oom_kills() >= 1);

    // The agent (PID 1) survived. Freeing /tmp frees the memory.
    let (out, code) = d.exec("tmpmem", "rm -f /tmp/fill; echo alive").await;
    println!("after: exit {code}, output {out:?}");
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    assert!(!fill.exists());
    delete(&d, "tmpmem").await;
    assert_gone(&d, &dirs, "tmpmem");
}

#[tokio::test]
async fn requested_resources_reach_the_kernel_and_over_maximum_is_refused() {
    if !privileged("requested_resources_reach_the_kernel_and_over_maximum_is_refused") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    let parent = dirs.cgroup_parent.as_str();
    create(
        &d,
        "res",
        json!({"memory_mb": 200, "cpus": 0.25, "pids": 100}),
    )
    .await;
    let memsw = cg_file(
        &root,
        parent,
        "res",
        "memory",
        "memory.memsw.limit_in_bytes",
        "memory.swap.max",
    );
    let l = open(&root, "res").limits().unwrap();
    println!("res: {l:?}");
    assert_eq!(l.memory_max_bytes, Some(200 << 20));
    assert_eq!(l.pids_max, Some(100));
    assert_eq!(
        (l.cpu_quota_usec, l.cpu_period_usec),
        (Some(25_000), 100_000)
    );
    if memsw.exists() {
        assert_eq!(l.swap_max_bytes, Some(0), "swap not disabled");
    } else {
        println!(
            "note: no swap accounting on this kernel ({} missing)",
            memsw.display()
        );
    }

    // No request: the node defaults.
    create(&d, "dflt", Value::Null).await;
    let l = open(&root, "dflt").limits().unwrap();
    assert_eq!(l.memory_max_bytes, Some(2048 << 20));
    assert_eq!(l.pids_max, Some(512));
    assert_eq!(l.cpu_quota_usec, Some(100_000));

    for (i, res) in [
        json!({"memory_mb": 8193}),
        json!({"cpus": 4.5}),
        json!({"pids": 4097}),
        json!({"memory_mb": 8}),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("over{i}");
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id": "t", "uid": "u1", "resources": res}))
            .await;
        assert_eq!(s, 400, "{res}: {v}");
        assert_gone(&d, &dirs, &id);
        let (s, _) = d.json("GET", &format!("/api/sandboxes/{id}"), None).await;
        assert_eq!(s, 404);
    }
    assert_eq!(list(&d).await.len(), 2);
    delete(&d, "res").await;
    delete(&d, "dflt").await;
    assert_gone(&d, &dirs, "res");
    assert_gone(&d, &dirs, "dflt");
    assert_eq!(cgroups_under(parent), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn failed_create_leaves_no_cgroup() {
    if !privileged("failed_create_leaves_no_cgroup") {
        return;
    }
    let dirs = NativeDirs::new();
    // The "agent" exits at once: the launch fails after the cgroup exists.
    let cfg = config_file(&dirs, "[native]\nagent_path = \"/bin/false\"\n");
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_CONFIG", &cfg)]);
    cgroup_root(&dirs);
    let (s, v) = d
        .create(json!({"sandbox_id": "dud", "thread_id": "t", "uid": "u1"}))
        .await;
    println!("create with a dead agent: {s} {v}");
    assert_eq!(s, 500, "{v}");
    assert_gone(&d, &dirs, "dud");
    assert_eq!(cgroups_under(&dirs.cgroup_parent), Vec::<PathBuf>::new());
    assert!(list(&d).await.is_empty());
    // Not even a zombie: the dead agent was re-parented to the daemon.
    assert_eq!(children_of(d.pid()), 0);
}

#[tokio::test]
async fn restart_removes_orphan_cgroups() {
    if !privileged("restart_removes_orphan_cgroups") {
        return;
    }
    let dirs = NativeDirs::new();
    let parent = dirs.cgroup_parent.clone();
    let mut d = Daemon::start_native(&dirs, &[]);
    let root = cgroup_root(&dirs);
    create(&d, "orph", Value::Null).await;
    let (out, _) = d.exec("orph", "echo up").await;
    assert_eq!(out, "up\n");

    // The daemon dies, then someone kills the sandbox by hand.
    d.kill();
    let pids = open(&root, "orph").pids().unwrap();
    assert!(!pids.is_empty());
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let t = Instant::now();
    while !procs_in(&parent, "orph").is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "sandbox survived SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Plus a cgroup no sandbox owns, with a live process in it.
    let planted = cgroup_dirs(&parent, None)
        .into_iter()
        .map(|p| p.join("planted"))
        .collect::<Vec<_>>();
    for p in &planted {
        std::fs::create_dir(p).unwrap();
    }
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    for p in planted.iter().filter(|p| {
        p.to_string_lossy().contains("/memory/")
            || p.to_string_lossy().contains("/pids/")
            || !root.layout().uses_v1()
    }) {
        std::fs::write(p.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    }
    println!("planted {} orphan cgroup dirs", planted.len());
    assert!(!planted.is_empty());
    assert!(cgroup_dirs(&parent, Some("orph")).len() >= planted.len());

    let state = d.take_state_dir();
    let d = Daemon::start_native_in(&dirs, state, &[]);
    assert_eq!(
        cgroups_under(&parent),
        Vec::<PathBuf>::new(),
        "orphans left"
    );
    assert!(d.log_contains("removed orphan cgroup"));
    assert!(list(&d).await.is_empty());
    let t = Instant::now();
    while sleeper.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the orphan's process survived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_gone(&d, &dirs, "orph");
    assert_gone(&d, &dirs, "planted");
}
