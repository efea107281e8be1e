//! The prepared `/etc` of native sandboxes (`src/backend/native/etc.rs`,
//! privileged): one read-only directory shared by the sandboxes of a
//! network mode, holding the host's `/etc` entries of `rootfs_binds` and
//! the generated files, with each sandbox's `hosts` and `hostname` bound
//! over it; not writable by the sandbox's user nor, with a user namespace,
//! by the sandbox's root.

use crate::common;

use std::path::{Path, PathBuf};

use common::{mkdir_user, privileged, Daemon, NativeDirs};
use serde_json::json;

const ON: [(&str, &str); 1] = [("SANDBOXD_USERNS", "on")];

/// `(destination, source)` of the `/etc` mounts in sandbox `id`'s bundle.
fn etc_mounts(d: &Daemon, id: &str) -> Vec<(String, PathBuf)> {
    let p = d
        .state_dir
        .path()
        .join("sandboxes")
        .join(id)
        .join("bundle/config.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let dest = m["destination"].as_str()?;
            let src = PathBuf::from(m["source"].as_str()?);
            dest.starts_with("/etc").then(|| (dest.to_string(), src))
        })
        .collect()
}

/// Every file below `dir` with its content (symlinks as their target).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            out.push((p, Vec::new()));
        } else if meta.file_type().is_symlink() {
            let t = std::fs::read_link(&p).unwrap();
            out.push((p, t.as_os_str().as_encoded_bytes().to_vec()));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn prepared_etc_is_shared_read_only_and_names_each_sandbox() {
    if !privileged("prepared_etc_is_shared_read_only_and_names_each_sandbox") {
        return;
    }
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(&dirs, &ON);
    assert!(d.log_contains("user namespaces on"));
    mkdir_user(&dirs.workspace("u1"));
    mkdir_user(&dirs.skills().join("u1"));
    for (id, t) in [("e1", "t1"), ("e2", "t2")] {
        let (s, v) = d
            .create(json!({"sandbox_id": id, "thread_id": t, "uid": "u1"}))
            .await;
        assert_eq!(s, 200, "{v}");
    }

    // The bundles: one shared /etc source under the state directory, and
    // each sandbox's own hosts and hostname.
    let (m1, m2) = (etc_mounts(&d, "e1"), etc_mounts(&d, "e2"));
    let dests: Vec<&str> = m1.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(dests, ["/etc", "/etc/hosts", "/etc/hostname"], "{m1:?}");
    let prepared = m1[0].1.clone();
    assert_eq!(m2[0].1, prepared, "both sandboxes share one /etc");
    assert!(
        prepared.starts_with(d.state_dir.path().join("etc")),
        "{prepared:?}"
    );
    for (id, m) in [("e1", &m1), ("e2", &m2)] {
        for (_, src) in &m[1..] {
            assert!(
                src.starts_with(d.state_dir.path().join("sandboxes").join(id)),
                "{id}: {src:?}"
            );
        }
    }
    let before = snapshot(&prepared);

    // Inside, as the sandbox's user: the generated and the host's files,
    // nothing else of the host's /etc, its own names, nothing writable.
    let host_entries: Vec<&str> = [
        "ssl",
        "localtime",
        "nsswitch.conf",
        "ld.so.cache",
        "profile",
    ]
    .into_iter()
    .filter(|e| Path::new("/etc").join(e).exists())
    .collect();
    assert!(!host_entries.is_empty(), "this host has none of them");
    for (id, other) in [("e1", "e2"), ("e2", "e1")] {
        let script = format!(
            "cat /etc/hostname; grep -c 'sbx-{id}' /etc/hosts; grep -c 'sbx-{other}' /etc/hosts; \
             grep -c '^gem:x:1000:1000:' /etc/passwd; grep -c '^gem:x:1000:' /etc/group; \
             test -s /etc/resolv.conf && echo resolv; \
             for e in {}; do test -e /etc/$e && echo has $e; done; \
             test -e /etc/shadow || echo no-shadow; \
             awk '$5 ~ /^\\/etc/ {{print $5, substr($6, 1, 2)}}' /proc/self/mountinfo; \
             for p in /etc/x /etc/passwd /etc/hosts /etc/hostname /etc/{}; do \
               (echo x > $p) 2>/dev/null && echo WROTE $p; done; \
             echo done",
            host_entries.join(" "),
            host_entries[0],
        );
        let (out, code) = d.exec(id, &script).await;
        assert_eq!(code, 0, "{out}");
        let mut want = format!("sbx-{id}\n1\n0\n1\n1\nresolv\n");
        for e in &host_entries {
            want.push_str(&format!("has {e}\n"));
        }
        want.push_str("no-shadow\n/etc ro\n/etc/hosts ro\n/etc/hostname ro\ndone\n");
        assert_eq!(out, want, "{id}");
    }
    if Path::new("/etc/nsswitch.conf").is_file() {
        let (out, _) = d.exec("e1", "cat /etc/nsswitch.conf").await;
        assert_eq!(
            out,
            std::fs::read_to_string("/etc/nsswitch.conf").unwrap(),
            "a copy of the host's file"
        );
    }

    // As the sandbox's root (every capability in its user namespace): the
    // mounts are locked read-only.
    let pid = {
        let p = d.state_dir.path().join("sandboxes/e1/state.json");
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        st["pid"].as_u64().unwrap()
    };
    let script = "id -u; \
        for m in /etc /etc/hosts /etc/hostname; do \
          mount -o remount,bind,rw $m 2>/dev/null && echo LOOSENED $m; \
        done; \
        touch /etc/probe 2>/dev/null && echo WROTE /etc/probe; \
        (echo x >> /etc/passwd) 2>/dev/null && echo WROTE /etc/passwd; \
        (echo x >> /etc/hosts) 2>/dev/null && echo WROTE /etc/hosts; \
        chmod 777 /etc 2>/dev/null && echo WROTE /etc; \
        chown 0 /etc/group 2>/dev/null && echo WROTE /etc/group; \
        for m in /etc/hosts /etc; do umount -l $m 2>/dev/null && echo UNMOUNTED $m; done; \
        echo done";
    let text = common::sh_as_sandbox_root(pid, false, script);
    for bad in ["LOOSENED", "UNMOUNTED", "WROTE"] {
        assert!(!text.contains(bad), "{text}");
    }
    assert_eq!(snapshot(&prepared), before, "the prepared /etc changed");
    let (out, _) = d.exec("e2", "cat /etc/hostname").await;
    assert_eq!(out, "sbx-e2\n");

    // A sandbox without network: another prepared /etc (its resolv.conf).
    let (s, v) = d
        .create(json!({"sandbox_id": "e3", "thread_id": "t3", "uid": "u1", "network": "none"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let m3 = etc_mounts(&d, "e3");
    assert_ne!(m3[0].1, prepared);
    let (out, _) = d
        .exec("e3", "cat /etc/resolv.conf; cat /etc/hostname")
        .await;
    assert_eq!(out, "# sandboxd: no network\nsbx-e3\n");
}

/// The prepared `/etc` is rebuilt from the host's files at every start: a
/// sandbox adopted across a restart keeps the directory it was created
/// with (removing it would empty that sandbox's `/etc`), a new one gets the
/// new content, and a start that finds no sandbox removes the old ones.
/// The host file changed here is the resolver list (`[network]
/// resolv_conf`), which the egress `resolv.conf` is made from.
#[tokio::test]
async fn the_prepared_etc_follows_the_host_across_restarts() {
    if !privileged("the_prepared_etc_follows_the_host_across_restarts") {
        return;
    }
    let dirs = NativeDirs::new();
    mkdir_user(&dirs.workspace("u1"));
    mkdir_user(&dirs.skills().join("u1"));
    let resolv = dirs.root.path().join("host-resolv.conf");
    std::fs::write(&resolv, "nameserver 192.0.2.1\n").unwrap();
    let r = resolv.to_string_lossy().to_string();
    let env = [("SANDBOXD_NETWORK_RESOLV_CONF", r.as_str())];
    let nameservers = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("nameserver"))
            .map(String::from)
            .collect()
    };

    let mut d = Daemon::start_native(&dirs, &env);
    let (s, v) = d
        .create(json!({"sandbox_id": "a1", "thread_id": "t1", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, _) = d.exec("a1", "cat /etc/resolv.conf").await;
    assert_eq!(nameservers(&out), ["nameserver 192.0.2.1"], "{out}");
    let first = etc_mounts(&d, "a1")[0].1.clone();

    // Restart (the sandbox survives a killed daemon) after the host's
    // resolvers changed.
    d.kill();
    let state = d.take_state_dir();
    drop(d);
    std::fs::write(&resolv, "nameserver 192.0.2.2\n").unwrap();
    let mut d = Daemon::start_native_in(&dirs, state, &env);
    let (out, _) = d.exec("a1", "cat /etc/resolv.conf").await;
    assert_eq!(
        nameservers(&out),
        ["nameserver 192.0.2.1"],
        "the adopted sandbox keeps its /etc: {out}"
    );
    assert!(first.join("passwd").is_file(), "{first:?} was removed");
    let (s, v) = d
        .create(json!({"sandbox_id": "a2", "thread_id": "t2", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (out, _) = d.exec("a2", "cat /etc/resolv.conf").await;
    assert_eq!(nameservers(&out), ["nameserver 192.0.2.2"], "{out}");
    let second = etc_mounts(&d, "a2")[0].1.clone();
    assert_ne!(first, second);

    // No sandbox left: the next start keeps only the current content.
    for id in ["a1", "a2"] {
        let (s, v) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200, "{id}: {v}");
    }
    d.kill();
    let state = d.take_state_dir();
    drop(d);
    let d = Daemon::start_native_in(&dirs, state, &env);
    assert!(!first.exists(), "{first:?} outlived its sandbox");
    assert!(second.join("passwd").is_file());
    let left = std::fs::read_dir(d.state_dir.path().join("etc"))
        .unwrap()
        .count();
    assert_eq!(left, 2, "one prepared /etc per network mode");
}
