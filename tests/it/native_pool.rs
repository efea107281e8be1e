//! The warm pool (`[pool] size`, privileged): a create claims a started
//! member and gets the user's workspace (idmapped, read-write), skills
//! (read-only, locked even for the sandbox's root), env, workdir, limits and
//! hostname; a claimed sandbox survives a daemon restart while unclaimed
//! members are destroyed; a member that died falls back to a cold start; an
//! ephemeral create gets a fresh tmpfs; the pooled agent answers only the
//! one claim.

use crate::agent_support::Agent;
use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use common::{mkdir_user, privileged, Daemon, NativeDirs, TOKEN};
use serde_json::json;

fn state(d: &Daemon, id: &str) -> serde_json::Value {
    d.sandbox_state(id)
}

fn members(d: &Daemon) -> Vec<String> {
    d.pool_members()
}

fn attach_points(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.state_dir.path().join("pool-mounts"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Waits until `n` members are ready (`sandboxd_pool_ready`).
async fn wait_ready(d: &Daemon, n: i64) {
    for _ in 0..300 {
        if metric(d, "sandboxd_pool_ready").await == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} pool members not ready within 15 s");
}

async fn metric(d: &Daemon, name: &str) -> Option<i64> {
    let (s, _, body) = d.call("GET", "/metrics", None, Some(TOKEN)).await;
    assert_eq!(s, 200);
    let text = String::from_utf8_lossy(&body).to_string();
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn claims(d: &Daemon, result: &str) -> i64 {
    metric(d, &format!("sandboxd_pool_claims{{result=\"{result}\"}}"))
        .await
        .unwrap_or(0)
}

/// Whether `pid` runs (a zombie waiting for its parent does not).
fn alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The memory limit of a cgroup named `key` under `parent`, v1 or v2.
fn memory_limit(cgroup: &str) -> u64 {
    let rel = cgroup.trim_start_matches('/');
    for p in [
        PathBuf::from("/sys/fs/cgroup/memory")
            .join(rel)
            .join("memory.limit_in_bytes"),
        PathBuf::from("/sys/fs/cgroup").join(rel).join("memory.max"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return s.trim().parse().unwrap();
        }
    }
    panic!("no memory limit file for {cgroup}");
}

#[tokio::test]
async fn a_create_claims_a_ready_member_with_the_users_directories() {
    if !privileged("a_create_claims_a_ready_member_with_the_users_directories") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_POOL_SIZE", "1")]);
    mkdir_user(&dirs.workspace("u1").join("p"));
    let host_file = dirs.workspace("u1").join("p/from-host.txt");
    std::fs::write(&host_file, "platform\n").unwrap();
    std::os::unix::fs::chown(&host_file, Some(1000), Some(1000)).unwrap();
    mkdir_user(&dirs.skills().join("u1"));
    std::fs::write(dirs.skills().join("u1/skill.md"), "skill\n").unwrap();
    wait_ready(&d, 1).await;
    let key = members(&d).pop().unwrap();

    let (s, v) = d
        .create(json!({"sandbox_id": "pa", "thread_id": "t1", "uid": "u1",
                       "workdir_path": "p", "env": {"FOO": "bar"},
                       "resources": {"memory_mb": 300}}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "claimed").await, 1, "the create did not claim");
    assert!(d.wait_log(
        "claimed a pool member sandbox_id=pa",
        std::time::Duration::from_secs(5)
    ));
    // The member's state directory became the sandbox's; its cgroup keeps
    // the member's key.
    let st = state(&d, "pa");
    assert_eq!(st["phase"], "running", "{st}");
    assert_eq!(st["identity"]["uid"], "u1", "{st}");
    let cgroup = st["cgroup"].as_str().unwrap().to_string();
    assert!(cgroup.ends_with(&key), "{cgroup} {key}");
    assert_eq!(memory_limit(&cgroup), 300 << 20);

    let (out, code) = d
        .exec(
            "pa",
            "id -u; hostname; cat /etc/hostname; pwd; echo \"FOO=$FOO\"; cat from-host.txt; \
             cat /home/gem/skills/skill.md; echo mine > new.txt; \
             touch /home/gem/skills/t 2>/dev/null || echo skills-ro",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "1000",
            "sbx-pa",
            "sbx-pa",
            "/home/gem/user-data/p",
            "FOO=bar",
            "platform",
            "skill",
            "skills-ro"
        ],
        "{out}"
    );
    let new = dirs.workspace("u1").join("p/new.txt");
    let m = std::fs::metadata(&new).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (1000, 1000),
        "written as the sandbox user"
    );

    // The sandbox's root, with every capability and no seccomp, cannot make
    // the skills writable; nothing of the user's stays mounted on the host.
    let pid = st["pid"].as_u64().unwrap();
    let out = common::sh_as_sandbox_root(
        pid,
        false,
        "id -u; mount -o remount,bind,rw /home/gem/skills 2>/dev/null || echo refused; \
         touch /home/gem/skills/x 2>/dev/null || echo read-only; echo done",
    );
    assert!(
        out.contains("refused") && out.contains("read-only"),
        "{out}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let ws = dirs.workspace("u1").display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&ws)),
        "the workspace is mounted on the host:\n{mounts}"
    );
    // The agent's claim endpoint is gone once claimed.
    let (s, _) = d
        .json(
            "POST",
            "/api/sandboxes/pa/proxy/internal/claim",
            Some(json!({"env": [], "cwd": "/"})),
        )
        .await;
    assert_eq!(s, 404);

    // The pool refills; the delete removes the attach points and never
    // the user's files.
    wait_ready(&d, 1).await;
    assert!(attach_points(&d).contains(&key));
    let (s, v) = d.json("DELETE", "/api/sandboxes/pa", None).await;
    assert_eq!(s, 200, "{v}");
    assert!(!attach_points(&d).contains(&key), "{:?}", attach_points(&d));
    assert!(!alive(pid));
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "platform\n");
    assert_eq!(std::fs::read_to_string(&new).unwrap(), "mine\n");
}

#[tokio::test]
async fn a_restart_adopts_claimed_sandboxes_and_destroys_unclaimed_members() {
    if !privileged("a_restart_adopts_claimed_sandboxes_and_destroys_unclaimed_members") {
        return;
    }
    let dirs = NativeDirs::new();
    let pool2 = [("SANDBOXD_POOL_SIZE", "2")];
    let mut d = Daemon::start_native(&dirs, &pool2);
    mkdir_user(&dirs.workspace("u1"));
    wait_ready(&d, 2).await;
    let (s, v) = d
        .create(json!({"sandbox_id": "pr", "thread_id": "t1", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "claimed").await, 1);
    let (_, code) = d.exec("pr", "echo kept > /home/gem/user-data/f").await;
    assert_eq!(code, 0);
    wait_ready(&d, 2).await;
    let member_pids: Vec<u64> = members(&d)
        .iter()
        .map(|k| state(&d, k)["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(member_pids.len(), 2);
    let claimed_key = state(&d, "pr")["cgroup"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();

    d.kill();
    let state_dir = d.take_state_dir();
    let d = Daemon::start_native_in(&dirs, state_dir, &[("SANDBOXD_POOL_SIZE", "0")]);
    assert!(d.wait_log(
        "adopted running sandbox sandbox_id=pr",
        Duration::from_secs(10)
    ));
    for pid in &member_pids {
        assert!(!alive(*pid), "member {pid} of the old daemon still runs");
    }
    assert!(members(&d).is_empty(), "{:?}", members(&d));
    // Only the claimed sandbox's attach points are left, and its
    // workspace is still there inside.
    assert_eq!(attach_points(&d), [claimed_key]);
    let (out, code) = d.exec("pr", "cat /home/gem/user-data/f").await;
    assert_eq!((out.as_str(), code), ("kept\n", 0));
    let (s, v) = d.json("DELETE", "/api/sandboxes/pr", None).await;
    assert_eq!(s, 200, "{v}");
    assert!(attach_points(&d).is_empty());
    assert_eq!(
        std::fs::read_to_string(dirs.workspace("u1").join("f")).unwrap(),
        "kept\n"
    );
}

#[tokio::test]
async fn a_dead_member_falls_back_to_a_cold_start_and_ephemeral_gets_a_tmpfs() {
    if !privileged("a_dead_member_falls_back_to_a_cold_start_and_ephemeral_gets_a_tmpfs") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_POOL_SIZE", "1")]);
    mkdir_user(&dirs.workspace("u1"));
    wait_ready(&d, 1).await;
    let key = members(&d).pop().unwrap();
    let pid = state(&d, &key)["pid"].as_u64().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (s, v) = d
        .create(json!({"sandbox_id": "pd", "thread_id": "t1", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "failed").await, 1);
    assert!(d.log_contains("claim failed"));
    let (out, code) = d.exec("pd", "id -u; echo ok > /home/gem/user-data/x").await;
    assert_eq!((out.as_str(), code), ("1000\n", 0));
    assert!(
        !attach_points(&d).contains(&key),
        "the dead member's attach points stay"
    );

    // Ephemeral (no inherited env, no workdir): a fresh tmpfs owned by the
    // sandbox user, gone with the sandbox.
    wait_ready(&d, 1).await;
    let (s, v) = d
        .create(json!({"sandbox_id": "pe", "thread_id": "t1", "uid": "u1", "inherit_env": false}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "claimed").await, 1);
    let (out, code) = d
        .exec(
            "pe",
            "stat -f -c %T /home/gem/user-data; stat -c %u /home/gem/user-data; \
             echo e > /home/gem/user-data/e && echo wrote; ls /home/gem/user-data",
        )
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("tmpfs\n1000\nwrote\ne\n", 0),
        "{out}"
    );
    // A network mode the members were not started with: started cold.
    let (s, v) = d
        .create(json!({"sandbox_id": "pn", "thread_id": "t1", "uid": "u1", "network": "none"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "empty").await, 1);
}

#[test]
fn the_pooled_agent_answers_only_one_claim() {
    let a = Agent::start_with_args(&["--pooled"], &[]);
    let r = a.post_json("/v1/shell/exec", json!({"command": "true"}));
    assert_eq!(
        r.status, 503,
        "a pooled agent serves nothing before its claim"
    );
    let dir = a.path("work");
    std::fs::create_dir(&dir).unwrap();
    let bad = a.post_json(
        "/internal/claim",
        json!({"env": ["NOEQUALS"], "cwd": dir.to_str().unwrap()}),
    );
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.body));
    let r = a.post_json(
        "/internal/claim",
        json!({"env": ["GREETING=hello", "PATH=/usr/bin:/bin"], "cwd": dir.to_str().unwrap()}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["success"], true, "{v}");
    let again = a.post_json("/internal/claim", json!({"env": [], "cwd": "/"}));
    assert_eq!(again.status, 404, "a second claim");
    let out = a.exec(json!({"command": "pwd; echo $GREETING; env | wc -l"}));
    let text = out["output"].as_str().unwrap().to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        std::fs::canonicalize(&dir).unwrap().to_str().unwrap(),
        "{text}"
    );
    assert_eq!(lines[1], "hello", "{text}");
}

#[tokio::test]
async fn an_extra_pool_serves_its_network_mode() {
    if !privileged("an_extra_pool_serves_its_network_mode") {
        return;
    }
    let dirs = NativeDirs::new();
    let cfg = dirs.root.path().join("pool.toml");
    std::fs::write(&cfg, "[[pool.extra]]\nnetwork = \"none\"\nsize = 1\n").unwrap();
    // SANDBOXD_POOL_SIZE=0 (the harness's): only the extra pool.
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_CONFIG", cfg.to_str().unwrap())]);
    mkdir_user(&dirs.workspace("u1"));
    wait_ready(&d, 1).await;
    let key = members(&d).pop().unwrap();
    let (s, v) = d
        .create(json!({"sandbox_id": "xn", "thread_id": "t1", "uid": "u1", "network": "none"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "claimed").await, 1);
    assert!(state(&d, "xn")["cgroup"].as_str().unwrap().ends_with(&key));
    // Loopback only, as a cold `none` sandbox.
    let (out, code) = d.exec("xn", "ls /sys/class/net").await;
    assert_eq!((out.as_str(), code), ("lo\n", 0), "{out}");
    // The default network mode has no pool here: started cold.
    let (s, v) = d
        .create(json!({"sandbox_id": "xe", "thread_id": "t1", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&d, "empty").await, 1);
    wait_ready(&d, 1).await;
}
