//! Native sandboxes end to end (privileged): real `sandbox-init`, real
//! namespaces and mounts, the real agent, reached through the daemon's
//! proxy. Each test skips loudly when not root.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::Path;

use common::{children_of, mkdir_user, privileged, Daemon, NativeDirs};
use serde_json::json;

fn body(id: &str, thread: &str, uid: &str, workdir: Option<&str>) -> serde_json::Value {
    json!({"sandbox_id": id, "thread_id": thread, "uid": uid, "workdir_path": workdir})
}

/// Host directory listing (names) or empty.
fn ls(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn same_workdir_shares_files_not_tmp() {
    if !privileged("same_workdir_shares_files_not_tmp") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    mkdir_user(&dirs.workspace("u1").join("projects/p1"));
    let (s, a) = d.create(body("sa", "t1", "u1", Some("projects/p1"))).await;
    assert_eq!(s, 200, "{a}");
    let (s, b) = d.create(body("sb", "t2", "u1", Some("projects/p1"))).await;
    assert_eq!(s, 200, "{b}");
    assert_ne!(a["generation"], b["generation"]);
    let (out, code) = d
        .exec(
            "sa",
            "pwd; echo from-a > shared.txt; echo secret > /tmp/a-only",
        )
        .await;
    assert_eq!((out.trim(), code), ("/home/gem/user-data/projects/p1", 0));
    let (out, code) = d.exec("sb", "cat shared.txt; ls /tmp").await;
    assert_eq!(code, 0);
    assert_eq!(out, "from-a\n", "b sees a's project file but not a's /tmp");
    // Files are owned by the sandbox user on the host.
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(dirs.workspace("u1").join("projects/p1/shared.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 1000));
}

#[tokio::test]
async fn workdir_files_survive_delete_and_tmp_is_fresh() {
    if !privileged("workdir_files_survive_delete_and_tmp_is_fresh") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    mkdir_user(&dirs.workspace("u1").join("w"));
    let (s, a) = d.create(body("s1", "t1", "u1", Some("w"))).await;
    assert_eq!(s, 200, "{a}");
    let (_, code) = d
        .exec("s1", "head -c 100000 /dev/urandom > blob.bin; sha256sum blob.bin > blob.sum; echo x > /tmp/old")
        .await;
    assert_eq!(code, 0);
    let inside_sum = std::fs::read_to_string(dirs.workspace("u1").join("w/blob.sum")).unwrap();
    let g = a["generation"].as_str().unwrap();
    let (s, _) = d
        .json(
            "DELETE",
            &format!("/api/sandboxes/s1?expected_generation={g}"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    // On the host, byte for byte.
    let host = std::fs::read(dirs.workspace("u1").join("w/blob.bin")).unwrap();
    assert_eq!(host.len(), 100_000);
    use sha2::Digest;
    let host_sum = common::hex(&sha2::Sha256::digest(&host));
    assert!(
        inside_sum.starts_with(&host_sum),
        "{inside_sum} vs {host_sum}"
    );
    // A new sandbox of another thread reads it; its /tmp is fresh.
    let (s, _) = d.create(body("s2", "t2", "u1", Some("w"))).await;
    assert_eq!(s, 200);
    let (out, code) = d
        .exec("s2", "sha256sum -c blob.sum && ls -A /tmp | wc -l")
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("0\n"), "{out}");
}

#[tokio::test]
async fn skills_are_read_only_and_per_user() {
    if !privileged("skills_are_read_only_and_per_user") {
        return;
    }
    let dirs = NativeDirs::new();
    std::fs::create_dir_all(dirs.skills().join("u1/tool")).unwrap();
    std::fs::write(dirs.skills().join("u1/tool/SKILL.md"), "use the tool\n").unwrap();
    let d = Daemon::start_native(&dirs, &[]);
    assert_eq!(d.create(body("k1", "t", "u1", None)).await.0, 200);
    assert_eq!(d.create(body("k2", "t", "u2", None)).await.0, 200);
    let (out, code) = d.exec("k1", "cat /home/gem/skills/tool/SKILL.md").await;
    assert_eq!((out.as_str(), code), ("use the tool\n", 0));
    let (out, code) = d
        .exec(
            "k1",
            "echo x >> /home/gem/skills/tool/SKILL.md; echo y > /home/gem/skills/new",
        )
        .await;
    assert_ne!(code, 0);
    assert!(out.contains("Read-only file system"), "{out}");
    assert_eq!(
        std::fs::read_to_string(dirs.skills().join("u1/tool/SKILL.md")).unwrap(),
        "use the tool\n"
    );
    let (out, code) = d
        .exec(
            "k2",
            "ls -A /home/gem/skills; cat /home/gem/skills/tool/SKILL.md",
        )
        .await;
    assert_ne!(code, 0);
    assert!(!out.contains("use the tool"), "{out}");
}

#[tokio::test]
async fn ephemeral_sandbox_creates_nothing_on_the_host() {
    if !privileged("ephemeral_sandbox_creates_nothing_on_the_host") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let before_ud = ls(&dirs.user_data().join("shared"));
    let before_sk = ls(&dirs.skills());
    let (s, v) = d
        .create(
            json!({"sandbox_id":"e1","thread_id":"t","uid":"ephem","inherit_env":false,
                       "env":{"SECRET_USER_VAR":"1"}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, code) = d
        .exec("e1", "echo hi > /home/gem/user-data/f && cat /home/gem/user-data/f; ls /home/gem; env | grep -c SECRET_USER_VAR")
        .await;
    assert_eq!(out, "hi\nuser-data\n0\n", "code {code}");
    assert_eq!(ls(&dirs.user_data().join("shared")), before_ud);
    assert_eq!(ls(&dirs.skills()), before_sk);
    assert!(!dirs.workspace("ephem").exists());
}

#[tokio::test]
async fn environment_is_merged_and_fixed() {
    if !privileged("environment_is_merged_and_fixed") {
        return;
    }
    let dirs = NativeDirs::new();
    let envfile = dirs.root.path().join("sandbox.env");
    std::fs::write(&envfile, "GLOBAL_A=from-node\nSHARED=node\n").unwrap();
    let d = Daemon::start_native(
        &dirs,
        &[("SANDBOXD_SANDBOX_ENV_FILE", envfile.to_str().unwrap())],
    );
    let (s, _) = d
        .create(json!({"sandbox_id":"v1","thread_id":"t","uid":"u1",
                       "env":{"SHARED":"user","USER":"root","EMPTY":null}}))
        .await;
    assert_eq!(s, 200);
    let (out, _) = d
        .exec("v1", "echo $GLOBAL_A $SHARED $USER $USER_UID $USER_GID $HOME [$EMPTY]; env | grep -c SANDBOX_PROVISIONER_TOKEN")
        .await;
    assert_eq!(out, "from-node user gem 1000 1000 /home/gem []\n0\n");
}

#[tokio::test]
async fn bad_host_paths_are_refused_and_leave_nothing() {
    if !privileged("bad_host_paths_are_refused_and_leave_nothing") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let outside = tempfile::tempdir().unwrap();
    mkdir_user(&dirs.workspace("u1").join("real"));
    std::fs::write(dirs.workspace("u1").join("file"), "x").unwrap();
    symlink(outside.path(), dirs.workspace("u1").join("link")).unwrap();
    std::fs::create_dir_all(dirs.user_data().join("shared")).unwrap();
    symlink(outside.path(), dirs.user_data().join("shared/u2")).unwrap();
    std::fs::write(dirs.user_data().join("shared/u3"), "not a dir").unwrap();
    let cases = [
        (body("b1", "t", "u1", Some("missing")), "does not exist"),
        (body("b2", "t", "u1", Some("link")), "symlink"),
        (body("b3", "t", "u1", Some("link/sub")), "symlink"),
        (body("b4", "t", "u1", Some("file")), "not a directory"),
        (body("b5", "t", "u2", None), "symlink"),
        (body("b6", "t", "u3", None), "not a directory"),
        (body("b7", "t", "newuser", Some("p")), "does not exist"),
        (
            json!({"sandbox_id":"b8","thread_id":"t","uid":"u1","workdir_path":"real/../real"}),
            "workdir_path",
        ),
        (
            json!({"sandbox_id":"b9","thread_id":"t","uid":"u1","env":{"A\u{0}":"x"}}),
            "NUL",
        ),
        (
            json!({"sandbox_id":"b10","thread_id":"t","uid":"u1","env":{"A=B":"x"}}),
            "'='",
        ),
        (
            json!({"sandbox_id":"b11","thread_id":"t","uid":"u1","env":{"BIG":"x".repeat(300*1024)}}),
            "limit",
        ),
    ];
    for (b, needle) in cases {
        let (s, v) = d.create(b.clone()).await;
        assert_eq!(s, 400, "{b}: {v}");
        let detail = v["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{b}: {detail:?} lacks {needle:?}");
    }
    assert!(
        ls(outside.path()).is_empty(),
        "something was created through a symlink"
    );
    assert!(
        !dirs.workspace("newuser").exists(),
        "a refused create made a user dir"
    );
    assert!(!dirs.skills().join("newuser").exists());
    assert!(ls(&d.state_dir.path().join("sandboxes")).is_empty());
    let (_, v) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(v["count"], 0);
    // No sandbox process was left behind.
    assert_eq!(children_of(d.pid()), 0, "a sandbox process was left behind");
}

#[tokio::test]
async fn a_directory_swapped_for_a_symlink_is_never_mounted() {
    if !privileged("a_directory_swapped_for_a_symlink_is_never_mounted") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    mkdir_user(&dirs.workspace("u1").join("proj"));
    let (s, v) = d.create(body("w1", "t", "u1", Some("proj"))).await;
    assert_eq!(s, 200, "{v}");
    // The sandbox user replaces its project directory by a symlink to /.
    let (_, code) = d
        .exec(
            "w1",
            "cd /home/gem/user-data && mv proj proj.old && ln -s / proj",
        )
        .await;
    assert_eq!(code, 0);
    let (s, v) = d.create(body("w2", "t2", "u1", Some("proj"))).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("symlink"));
    // The whole workspace swapped for a symlink to / (by the host side,
    // as a user with host access could): the next create refuses it.
    d.json("DELETE", "/api/sandboxes/w1", None).await;
    let ws = dirs.workspace("u1");
    std::fs::rename(&ws, ws.with_extension("moved")).unwrap();
    symlink("/", &ws).unwrap();
    let (s, v) = d.create(body("w3", "t3", "u1", None)).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("symlink"), "{v}");
    assert_eq!(children_of(d.pid()), 0, "a sandbox process was left behind");
}

#[tokio::test]
async fn exec_timeout_kills_the_process_group_and_answers_before_n() {
    if !privileged("exec_timeout_kills_the_process_group_and_answers_before_n") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &[]);
    let (s, v) = d.create(body("to", "t", "u1", None)).await;
    assert_eq!(s, 200, "{v}");
    // A background child and a grandchild in the command's process group,
    // both outliving the timeout unless the whole group is killed.
    let cmd = "sleep 300 & echo $! > /tmp/child.pid; \
               bash -c 'sleep 301 & echo $! > /tmp/grandchild.pid; wait' & \
               echo started; sleep 302";
    let n = 5.0;
    let started = std::time::Instant::now();
    let (s, v) = d
        .json(
            "POST",
            "/api/sandboxes/to/proxy/v1/shell/exec",
            Some(json!({ "command": cmd, "timeout": n })),
        )
        .await;
    let took = started.elapsed().as_secs_f64();
    assert_eq!(s, 200, "{v}");
    // The agent contract: the answer leaves before the caller's own
    // timeout N (the client gives up at N).
    assert!(took < n, "answered after {took:.2}s, not before {n}s");
    assert_eq!(v["data"]["exit_code"], 124, "{v}");
    assert_eq!(v["data"]["status"], "hard_timeout", "{v}");
    assert!(
        v["data"]["output"]
            .as_str()
            .unwrap()
            .starts_with("started\n"),
        "{v}"
    );
    // Nothing of the group survives (killed, and reaped by the agent).
    let (out, code) = d
        .exec(
            "to",
            "for f in child grandchild; do p=$(cat /tmp/$f.pid); \
               for i in $(seq 50); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; \
               kill -0 $p 2>/dev/null && echo $f alive || echo $f gone; done; \
             cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "child gone\ngrandchild gone\n0\n");
}

#[tokio::test]
async fn a_failing_launch_step_is_reported_by_name_and_cleaned_up() {
    if !privileged("a_failing_launch_step_is_reported_by_name_and_cleaned_up") {
        return;
    }
    let dirs = NativeDirs::new();
    // A base spec whose mount table has a filesystem type no kernel knows:
    // sandbox-init fails at its mount step, after the fork.
    let mut base: serde_json::Value =
        serde_json::from_str(include_str!("../../oci/base.json")).unwrap();
    base["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/mnt/bogus", "type": "nosuchfs", "source": "none", "options": []
    }));
    let base_path = dirs.root.path().join("base.json");
    std::fs::write(&base_path, serde_json::to_vec(&base).unwrap()).unwrap();
    let cfg = dirs.root.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!("[native]\nbase_spec = \"{}\"\n", base_path.display()),
    )
    .unwrap();
    let d = Daemon::start_native(&dirs, &[("SANDBOXD_CONFIG", cfg.to_str().unwrap())]);
    let (s, v) = d.create(body("bad", "t", "u1", None)).await;
    assert_eq!(s, 500, "{v}");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("step mount") && detail.contains("/mnt/bogus"),
        "{detail}"
    );
    assert_eq!(children_of(d.pid()), 0, "a sandbox process was left behind");
    assert!(ls(&d.state_dir.path().join("sandboxes")).is_empty());
    for c in ls(Path::new("/sys/fs/cgroup")) {
        let left = Path::new("/sys/fs/cgroup")
            .join(c)
            .join(&dirs.cgroup_parent)
            .join("bad");
        assert!(!left.exists(), "cgroup left: {}", left.display());
    }
    let (_, list) = d.json("GET", "/api/sandboxes", None).await;
    assert_eq!(list["count"], 0);
}

/// The workdir is checked by the daemon, then entered by the launcher; a
/// sandbox user who swaps it for a symlink in between (held here by a
/// pausing failpoint after the bundle is written) makes the create fail at
/// the launcher's `chdir` step, which resolves the path inside the new root
/// with no symlink allowed, and nothing is left behind.
#[tokio::test]
async fn a_workdir_swapped_for_a_symlink_after_the_check_is_never_entered() {
    if !privileged("a_workdir_swapped_for_a_symlink_after_the_check_is_never_entered") {
        return;
    }
    common::require_failpoints();
    let dirs = NativeDirs::new();
    let pause = tempfile::tempdir().unwrap();
    let resume = pause.path().join("resume");
    let resume_s = resume.to_string_lossy().to_string();
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_FAILPOINT", "create:after_bundle"),
            ("SANDBOXD_FAILPOINT_PAUSE", resume_s.as_str()),
        ],
    );
    let proj = dirs.workspace("u1").join("proj");
    mkdir_user(&proj);
    let create = d.create(body("swap", "t", "u1", Some("proj")));
    let swap = async {
        let paused = pause.path().join("resume.paused");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !paused.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the create never paused"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Checked and bundled: now the project becomes a symlink to /tmp
        // (a directory the sandbox user may enter).
        std::fs::rename(&proj, proj.with_extension("old")).unwrap();
        symlink("/tmp", &proj).unwrap();
        std::fs::write(&resume, "").unwrap();
    };
    let ((s, v), ()) = tokio::join!(create, swap);
    assert_ne!(s, 200, "the create went through a swapped workdir: {v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("chdir"), "{v}");
    assert!(detail.contains("symlink"), "{v}");
    let (s, _) = d.json("GET", "/api/sandboxes/swap", None).await;
    assert_eq!(s, 404);
    assert_eq!(children_of(d.pid()), 0, "a sandbox process was left behind");
}
