//! The device allow-list of the base spec (`linux.resources.devices` in
//! `oci/base.json`) is what the kernel enforces for a native sandbox: the
//! sandbox's devices cgroup (v1 and hybrid hosts) holds exactly that list,
//! or (pure v2) the daemon's BPF device program is attached to its cgroup;
//! the devices on it keep working, and any other device node is refused,
//! also where no `nodev` mount stands in the way and also for a process
//! with every capability. Privileged.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{privileged, Daemon, NativeDirs};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use sandboxd::cgroups::{CgroupRoot, Layout};
use serde_json::json;

/// A character device the allow-list leaves out and that an unprivileged
/// process could otherwise open: the tun/tap clone device (10:200; opening
/// it is harmless, attaching an interface needs CAP_NET_ADMIN).
const TUN: (u64, u64) = (10, 200);

fn make_tun_node(path: &Path) {
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(TUN.0, TUN.1),
    )
    .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
    // mknod applies the umask.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

#[tokio::test]
async fn the_device_allow_list_is_enforced_by_the_devices_cgroup() {
    let test = "the_device_allow_list_is_enforced_by_the_devices_cgroup";
    if !privileged(test) {
        return;
    }
    let dirs = NativeDirs::new();
    let layout = CgroupRoot::detect(&dirs.cgroup_parent).unwrap().layout();
    let d = Daemon::start_native(&dirs, &[]);
    let (s, v) = d
        .create(json!({"sandbox_id": "dev", "thread_id": "t", "uid": "u1"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let hierarchy = if layout == Layout::V2 { "" } else { "devices" };
    let cg = Path::new("/sys/fs/cgroup")
        .join(hierarchy)
        .join(&dirs.cgroup_parent)
        .join("dev");

    // 1. The kernel holds exactly the base spec's list (v1), or our
    //    program (v2; what it decides is checked below and, request by
    //    request against the v1 rules, by the crate's unit tests).
    if layout == Layout::V2 {
        assert!(
            d.log_contains("device allow-list enforced by a BPF device program"),
            "start-up log"
        );
        let progs = sandboxd::cgroups::bpf::attached(&cg).unwrap();
        assert_eq!(progs.len(), 1, "device programs on {}", cg.display());
        let bundle =
            std::fs::read_to_string(d.state_dir.path().join("sandboxes/dev/bundle/config.json"))
                .unwrap();
        assert!(
            bundle.contains("\"devices\""),
            "the bundle carries the enforced list"
        );
    } else {
        check_v1_list(&cg);
    }
    check_enforced(&d, &dirs, &cg).await;
    // The layout is logged once (docs/operations.md), although `serve`
    // runs doctor's checks, which detect it too, before the backend.
    let layout_lines = d.log_count("cgroup layout detected");
    assert_eq!(layout_lines, 1, "the layout line, logged once");
    let (s, _) = d.json("DELETE", "/api/sandboxes/dev", None).await;
    assert_eq!(s, 200);
}

fn check_v1_list(cg: &Path) {
    let list = std::fs::read_to_string(cg.join("devices.list")).unwrap();
    let mut list: Vec<&str> = list.lines().collect();
    list.sort_unstable();
    assert_eq!(
        list,
        [
            "c 136:* rwm",
            "c 1:3 rwm",
            "c 1:5 rwm",
            "c 1:7 rwm",
            "c 1:8 rwm",
            "c 1:9 rwm",
            "c 5:0 rwm",
            "c 5:2 rwm",
        ],
        "devices.list of the sandbox's cgroup"
    );
}

/// Steps 2 to 5 on the sandbox "dev" of `d`, whose cgroup (the devices
/// one on v1) is `cg`.
async fn check_enforced(d: &Daemon, dirs: &NativeDirs, cg: &Path) {
    // 2. The devices on the list keep working inside.
    let (out, code) = d
        .exec(
            "dev",
            "set -e; echo x > /dev/null; head -c 3 /dev/zero | wc -c; \
             head -c 4 /dev/urandom | wc -c; head -c 4 /dev/random | wc -c; \
             (echo x > /dev/full) 2>&1 | grep -c 'No space left'; \
             /usr/bin/python3 -c 'import os, pty; m, s = pty.openpty(); print(os.ttyname(s)[:9])'",
        )
        .await;
    assert_eq!((out.as_str(), code), ("3\n4\n4\n1\n/dev/pts/\n", 0));

    // 3. A node outside the list in the sandbox's own /dev, a tmpfs that is
    //    not nodev (it must hold the allowed nodes): only the devices cgroup
    //    stands between the sandbox and the device. The host (root) plants
    //    it through /proc/<pid>/root.
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
    let pid = procs.lines().next().expect("a process in the sandbox");
    make_tun_node(&Path::new("/proc").join(pid).join("root/dev/planted-tun"));
    let (out, _) = d
        .exec("dev", "head -c 1 /dev/planted-tun; echo \" rc=$?\"")
        .await;
    assert!(
        out.contains("'/dev/planted-tun' for reading: Operation not permitted")
            && out.ends_with(" rc=1\n"),
        "opening a device outside the allow-list must fail with EPERM: {out:?}"
    );

    // 4. The same device in the workspace: the nodev mount answers first
    //    (EACCES); the cgroup is the second wall behind it.
    make_tun_node(&dirs.workspace("u1").join("planted-tun"));
    let (out, _) = d
        .exec(
            "dev",
            "head -c 1 /home/gem/user-data/planted-tun; echo \" rc=$?\"",
        )
        .await;
    assert!(
        out.contains("planted-tun' for reading: Permission denied") && out.ends_with(" rc=1\n"),
        "{out:?}"
    );

    // 5. Independent of capabilities: a root shell with every capability,
    //    moved into the sandbox's devices cgroup, can neither create nor
    //    open a device outside the list, and still opens /dev/null.
    let scratch = dirs.root.path().join("mknod-here");
    let script = format!(
        "echo $$ > {procs}; \
         mknod {scratch} c {major} {minor} 2>&1; echo \"mknod rc=$?\"; \
         head -c 1 /dev/net/tun 2>&1; echo \"tun rc=$?\"; \
         head -c 1 /dev/null; echo \"null rc=$?\"",
        procs = cg.join("cgroup.procs").display(),
        scratch = scratch.display(),
        major = TUN.0,
        minor = TUN.1,
    );
    let o = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Operation not permitted\nmknod rc=1\n")
            && out.contains("'/dev/net/tun' for reading: Operation not permitted\ntun rc=1\n")
            && out.ends_with("null rc=0\n"),
        "root inside the sandbox's devices cgroup: {out:?}"
    );
    assert!(!scratch.exists());
}
