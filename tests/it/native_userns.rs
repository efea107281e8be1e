//! User namespaces of native sandboxes (`[userns]`, privileged): disjoint
//! host id ranges per sandbox, idmapped user data and skills, per-sandbox
//! kernel accounting (inotify), locked read-only mounts even for the
//! sandbox's own root, ranges released on delete and kept on adoption,
//! and `mode = "on"` refusing a filesystem without idmapped mounts.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{mkdir_user, privileged, Daemon, NativeDirs};
use serde_json::json;

const ON: [(&str, &str); 1] = [("SANDBOXD_USERNS", "on")];

fn state(d: &Daemon, id: &str) -> serde_json::Value {
    d.sandbox_state(id)
}

/// Host PID and the first host id of sandbox `id`'s user namespace.
fn pid_and_base(d: &Daemon, id: &str) -> (u32, u32) {
    let st = state(d, id);
    let pid = st["pid"].as_u64().unwrap() as u32;
    let base = st["userns"]["host"]
        .as_u64()
        .unwrap_or_else(|| panic!("{id} has no user namespace in state.json: {st}"))
        as u32;
    assert_eq!(st["userns"]["size"], 65536, "{st}");
    (pid, base)
}

/// `Uid:` / `Gid:` lines of `/proc/<pid>/status` (real, effective, saved,
/// fs).
fn ids(pid: u32, field: &str) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn sandboxes_run_under_disjoint_host_ranges_with_idmapped_user_data() {
    if !privileged("sandboxes_run_under_disjoint_host_ranges_with_idmapped_user_data") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &ON);
    assert!(d.log_contains("user namespaces on"));
    mkdir_user(&dirs.workspace("u1").join("p"));
    // A file the platform wrote as 1000:1000, and a skill.
    let host_file = dirs.workspace("u1").join("p/from-host.txt");
    std::fs::write(&host_file, "platform\n").unwrap();
    std::os::unix::fs::chown(&host_file, Some(1000), Some(1000)).unwrap();
    mkdir_user(&dirs.skills().join("u1"));
    let skill = dirs.skills().join("u1/skill.md");
    std::fs::write(&skill, "skill\n").unwrap();
    std::os::unix::fs::chown(&skill, Some(1000), Some(1000)).unwrap();

    for (id, t) in [("ua", "t1"), ("ub", "t2")] {
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id": t, "uid": "u1", "workdir_path": "p"}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let (pa, ba) = pid_and_base(&d, "ua");
    let (pb, bb) = pid_and_base(&d, "ub");
    assert!(ba >= 1 << 31 && bb >= 1 << 31, "{ba} {bb}");
    assert!(ba.abs_diff(bb) >= 65536, "ranges overlap: {ba} and {bb}");
    // From the host: each agent runs as its own base + 1000, no groups.
    for (pid, base) in [(pa, ba), (pb, bb)] {
        assert_eq!(ids(pid, "Uid"), vec![base + 1000; 4], "pid {pid}");
        assert_eq!(ids(pid, "Gid"), vec![base + 1000; 4], "pid {pid}");
        let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
        assert_eq!(
            map.split_whitespace().collect::<Vec<_>>(),
            vec!["0".to_string(), base.to_string(), "65536".to_string()]
        );
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{pid}/setgroups"))
                .unwrap()
                .trim(),
            "deny"
        );
    }

    // Inside: uid 1000, a non-identity map, user data and skills owned by
    // the sandbox user, host files root-owned.
    let (out, code) = d
        .exec(
            "ua",
            "id -u; id -g; id -G; cat /proc/self/uid_map; \
             stat -c '%u:%g' /home/gem/user-data /home/gem/user-data/p/from-host.txt /home/gem/skills/skill.md \
               /usr/bin/env /.sandboxd/sandbox-agent /etc/passwd /tmp /home/gem",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], &["1000", "1000", "1000"], "{out}");
    let map: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(map, vec!["0", &ba.to_string(), "65536"], "{out}");
    assert_eq!(
        &lines[4..],
        &[
            "1000:1000",
            "1000:1000",
            "1000:1000",
            "0:0",
            "0:0",
            "0:0",
            "0:0",
            "1000:1000"
        ],
        "{out}"
    );

    // Writes: a new file lands as 1000:1000 on disk, the platform's file is
    // writable, skills and host files are not.
    let (out, code) = d
        .exec(
            "ua",
            "echo new > made-inside.txt && echo more >> from-host.txt && mkdir -p sub/dir && touch sub/dir/f && echo ok; \
             touch /home/gem/skills/x 2>&1; echo x >> /home/gem/skills/skill.md 2>&1; \
             touch /usr/bin/x 2>&1; echo x >> /.sandboxd/sandbox-agent 2>&1; true",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok\n"), "{out}");
    assert_eq!(
        out.matches("Read-only file system").count() + out.matches("Permission denied").count(),
        4,
        "{out}"
    );
    let ws = dirs.workspace("u1").join("p");
    for f in [
        "made-inside.txt",
        "from-host.txt",
        "sub",
        "sub/dir",
        "sub/dir/f",
    ] {
        let md = std::fs::metadata(ws.join(f)).unwrap();
        assert_eq!((md.uid(), md.gid()), (1000, 1000), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(&host_file).unwrap(),
        "platform\nmore\n"
    );
    assert_eq!(std::fs::read_to_string(&skill).unwrap(), "skill\n");
    // The other sandbox, same workspace, another range: same view.
    let (out, code) = d
        .exec(
            "ub",
            "cat made-inside.txt; stat -c '%u:%g' made-inside.txt; cat /proc/self/uid_map",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("new\n1000:1000\n"), "{out}");
    assert!(out.contains(&bb.to_string()), "{out}");
    // The sandbox cannot create user namespaces of its own (seccomp).
    let (out, code) = d.exec("ua", "unshare -U true 2>&1; echo rc=$?").await;
    assert_eq!(code, 0);
    assert!(out.contains("rc=1"), "unshare -U inside must fail: {out}");
}

/// The sandbox's own root (reached here from the host with `nsenter`,
/// which is outside seccomp and holds every capability in the sandbox's
/// user namespace: the worst case of an escape to root inside) can neither
/// make a read-only mount writable nor unmount one, and cannot write the
/// host's files or its own cgroup's limits. (The top of its root is the
/// one mount it may remount read-write, since `pivot_root` refuses a
/// locked new root; every inode of it belongs to the host's root, which
/// has no id inside, so nothing in it becomes writable.)
#[tokio::test]
async fn the_sandbox_root_cannot_loosen_its_mounts() {
    if !privileged("the_sandbox_root_cannot_loosen_its_mounts") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &ON);
    mkdir_user(&dirs.workspace("u1"));
    mkdir_user(&dirs.skills().join("u1"));
    let (s, v) = d
        .create(json!({"sandbox_id": "r1", "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (pid, _) = pid_and_base(&d, "r1");
    let script = "id -u; \
        for m in /usr /home/gem/skills /.sandboxd/sandbox-agent /etc/passwd /etc/hosts; do \
          mount -o remount,bind,rw $m 2>/dev/null && echo LOOSENED $m; \
        done; \
        mount -o remount,bind,rw / 2>/dev/null; \
        touch /probe 2>/dev/null && echo WROTE /; mkdir /probe-dir 2>/dev/null && echo WROTE /; \
        chmod 777 /etc 2>/dev/null && echo WROTE /etc; \
        for m in /usr/local /home/gem/user-data /usr /home/gem/skills; do \
          umount -l $m 2>/dev/null && echo UNMOUNTED $m; \
        done; \
        touch /usr/sandboxd-userns-probe 2>/dev/null && echo WROTE /usr; \
        touch /home/gem/skills/probe 2>/dev/null && echo WROTE skills; \
        mkdir -p /dev/shm/cg && mount -t cgroup2 none /dev/shm/cg 2>/dev/null && echo CG2 && \
          ([ -e /dev/shm/cg/cgroup.procs ] && echo HAS_PROCS); \
          [ -d /dev/shm/cg ] && \
          for f in /dev/shm/cg/pids.max /dev/shm/cg/memory.max /dev/shm/cg/cgroup.procs; do \
            [ -e $f ] && (echo 1 > $f) 2>/dev/null && echo WROTE $f; \
          done; \
        mkdir -p /dev/shm/cg1 && mount -t cgroup -o pids none /dev/shm/cg1 2>/dev/null && \
          for f in /dev/shm/cg1/pids.max /dev/shm/cg1/tasks; do \
            [ -e $f ] && (echo 1 > $f) 2>/dev/null && echo WROTE $f; \
          done; \
        echo done";
    let text = common::sh_as_sandbox_root(pid.into(), true, script);
    for bad in ["LOOSENED", "UNMOUNTED", "WROTE"] {
        assert!(!text.contains(bad), "{text}");
    }
    // Where cgroup2 could be mounted, the sandbox's own cgroup.procs was
    // there and not writable.
    assert!(
        !text.contains("CG2") || text.contains("HAS_PROCS"),
        "{text}"
    );
    assert!(!Path::new("/usr/sandboxd-userns-probe").exists());
    assert!(!dirs.skills().join("u1/probe").exists());
}

/// `fs.inotify.max_user_instances` is counted per owner of a top-level
/// user namespace: one sandbox using all of its instances leaves another
/// sandbox able to create its own (as host uid 1000 for all, it would not).
#[tokio::test]
async fn inotify_instances_are_counted_per_sandbox() {
    if !privileged("inotify_instances_are_counted_per_sandbox") {
        return;
    }
    let limit: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        limit <= 65536,
        "fs.inotify.max_user_instances = {limit}: too large for this test to exhaust"
    );
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &ON);
    mkdir_user(&dirs.workspace("u1").join("a"));
    mkdir_user(&dirs.workspace("u1").join("b"));
    for (id, w) in [("ia", "a"), ("ib", "b")] {
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id": id, "uid": "u1", "workdir_path": w}))
            .await;
        assert_eq!(s, 200, "{v}");
    }
    // In `ia`: processes of 3000 instances each (under RLIMIT_NOFILE) until
    // inotify_init1 fails with EMFILE below that, i.e. at the per-user
    // limit; then hold them until the test says so.
    let hog = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
total, err = 0, 0
while err == 0 and total <= 70000:
    if os.fork() == 0:
        n, e = 0, 0
        while n < 3000:
            if libc.inotify_init1(0) < 0:
                e = ctypes.get_errno(); break
            n += 1
        os.write(w, f"{n} {e}\n".encode())
        for _ in range(600):
            if os.path.exists("release"): break
            time.sleep(0.1)
        os._exit(0)
    n, err = map(int, os.read(r, 64).split())
    total += n
print(total, err, flush=True)
open("holding", "w").write(f"{total} {err}")
for _ in range(600):
    if os.path.exists("release"): break
    time.sleep(0.1)
"#;
    let d = std::sync::Arc::new(d);
    let d2 = d.clone();
    let hog_cmd = format!("python3 -c '{hog}'");
    let hogging = tokio::spawn(async move { d2.exec("ia", &hog_cmd).await });
    let holding = dirs.workspace("u1").join("a/holding");
    let end = Instant::now() + Duration::from_secs(60);
    // The file exists (empty) before the report is written into it: wait
    // for both numbers.
    let held = loop {
        let text = std::fs::read_to_string(&holding).unwrap_or_default();
        if text.split_whitespace().count() == 2 {
            break text;
        }
        assert!(Instant::now() < end, "the hog never reported: {text:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (total, err): (u64, i32) = {
        let mut it = held.split_whitespace().map(|v| v.parse::<i64>().unwrap());
        (it.next().unwrap() as u64, it.next().unwrap() as i32)
    };
    assert_eq!(
        err,
        libc::EMFILE,
        "the hog stopped for another reason: {held}"
    );
    assert!(
        total + 8 >= limit && total <= limit,
        "the hog got {total} instances, the per-user limit is {limit}"
    );
    let probe = "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); fd = l.inotify_init1(0); print(fd >= 0, ctypes.get_errno())'";
    // The hog's own sandbox is out of instances...
    let (out, _) = d.exec("ia", probe).await;
    assert_eq!(out.trim(), format!("False {}", libc::EMFILE), "{out}");
    // ...the other is not.
    let (out, code) = d.exec("ib", probe).await;
    assert_eq!(
        (out.split_whitespace().next(), code),
        (Some("True"), 0),
        "{out}"
    );
    std::fs::write(dirs.workspace("u1").join("a/release"), "").unwrap();
    let (out, code) = hogging.await.unwrap();
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn ranges_are_released_on_delete_and_kept_on_adoption() {
    if !privileged("ranges_are_released_on_delete_and_kept_on_adoption") {
        return;
    }
    let dirs = NativeDirs::new();
    let state_dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_native_in(&dirs, state_dir, &ON);
    let mut bases = Vec::new();
    for id in ["g1", "g2", "g3"] {
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id": id, "uid": "u1"}))
            .await;
        assert_eq!(s, 200, "{v}");
        bases.push(pid_and_base(&d, id).1);
    }
    let mut sorted = bases.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "{bases:?}");
    // A delete gives its range back: the next create takes it.
    let g = state(&d, "g2")["generation"].as_str().unwrap().to_string();
    let (s, _) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/g2?expected_generation={g}"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = d
        .create(json!({"sandbox_id": "g4", "thread_id": "g4", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        pid_and_base(&d, "g4").1,
        bases[1],
        "g2's range was not reused"
    );

    // kill -9 and restart: the sandboxes are adopted with their ranges,
    // which are not handed out again.
    d.kill();
    let state_dir = std::mem::replace(&mut d.state_dir, tempfile::tempdir().unwrap());
    drop(d);
    let d = Daemon::start_native_in(&dirs, state_dir, &ON);
    let mut held = vec![bases[0], bases[1], bases[2]];
    for id in ["g1", "g4", "g3"] {
        let (out, code) = d.exec(id, "cat /proc/self/uid_map").await;
        assert_eq!(code, 0, "{out}");
        let (_, base) = pid_and_base(&d, id);
        assert!(out.contains(&base.to_string()), "{id}: {out}");
    }
    let (s, v) = d
        .create(json!({"sandbox_id": "g5", "thread_id": "g5", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let b5 = pid_and_base(&d, "g5").1;
    assert!(
        !held.contains(&b5),
        "adopted range {b5} handed out again: {held:?}"
    );
    held.push(b5);
    // Deleting an adopted sandbox releases its range too.
    let g = state(&d, "g1")["generation"].as_str().unwrap().to_string();
    let (s, _) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/g1?expected_generation={g}"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = d
        .create(json!({"sandbox_id": "g6", "thread_id": "g6", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(pid_and_base(&d, "g6").1, bases[0]);
}

/// Unmounts a test mount on drop.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `ramfs` has no idmapped mounts: `on` refuses to start, naming the path;
/// `auto` starts without user namespaces and says so.
#[tokio::test]
async fn mode_on_refuses_a_filesystem_without_idmapped_mounts() {
    if !privileged("mode_on_refuses_a_filesystem_without_idmapped_mounts") {
        return;
    }
    let dirs = NativeDirs::new();
    let ud = dirs.user_data();
    std::fs::create_dir_all(&ud).unwrap();
    nix::mount::mount(
        Some("ramfs"),
        &ud,
        Some("ramfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let _unmount = Unmount(ud.clone());
    let state_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--state-dir")
        .arg(state_dir.path())
        .env_remove("SANDBOXD_CONFIG")
        .env("SANDBOX_PROVISIONER_TOKEN", common::TOKEN)
        .env("PROVISIONER_BACKEND", "native")
        .env("SANDBOXD_USER_DATA_ROOT", &ud)
        .env("SANDBOXD_SKILLS_ROOT", dirs.skills())
        .env("SANDBOXD_CGROUP_PARENT", &dirs.cgroup_parent)
        .env("SANDBOXD_NETWORK", "none")
        .env("SANDBOXD_USERNS", "on")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started on ramfs with mode on: {err}"
    );
    assert!(
        err.contains("[userns] mode = \\\"on\\\", but idmapped mounts do not work here")
            || err.contains("[userns] mode = \"on\", but idmapped mounts do not work here"),
        "{err}"
    );
    assert!(
        err.contains(&ud.display().to_string()),
        "the path is not named: {err}"
    );
    assert!(err.contains("MOUNT_ATTR_IDMAP"), "{err}");
    // Nothing was made in the state directory beyond what start-up makes.
    assert!(std::fs::read_dir(state_dir.path().join("sandboxes"))
        .map(|rd| rd.count() == 0)
        .unwrap_or(true));

    // auto: falls back, says so, sandboxes run as host uid 1000.
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_USERNS", "auto")]);
    assert!(d.log_contains("user namespaces OFF"), "no fallback warning");
    let (s, v) = d
        .create(json!({"sandbox_id": "f1", "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let st = state(&d, "f1");
    assert!(st.get("userns").is_none(), "{st}");
    let pid = st["pid"].as_u64().unwrap() as u32;
    assert_eq!(ids(pid, "Uid"), vec![1000; 4]);
    let (out, _) = d.exec("f1", "cat /proc/self/uid_map").await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        vec!["0", "0", "4294967295"],
        "{out}"
    );
}
