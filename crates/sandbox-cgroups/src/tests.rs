//! Unit tests over fake cgroup trees in a tempdir.
//!
//! libcgroups' v2 manager takes a custom root, so v2 creation and limits
//! go through it here. Its v1 manager reads the real mountinfo and always
//! works on `/sys/fs/cgroup`, so for v1 only our own file-level code (limit
//! readback, OOM counter, CPU usage, listing) is tested over a fake tree;
//! v1 creation/limits/kill/removal are covered by `tests/cgroups_real.rs`.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::layout::parse_layout;
use super::leaf::{move_to_leaf, started_in_unit_root};
use super::root::normalize_parent;
use super::*;

const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const V1: &str = "\
22 21 0:20 / /proc rw - proc proc rw
31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,nosuid shared:19 - cgroup cgroup rw,pids
";

const V2: &str = "\
22 21 0:20 / /proc rw - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

fn root() -> &'static Path {
    Path::new("/sys/fs/cgroup")
}

#[test]
fn layout_hybrid() {
    let m = parse_layout(HYBRID, root()).unwrap();
    assert_eq!(m.layout, Layout::Hybrid);
    assert_eq!(m.v1["memory"], root().join("memory"));
    assert_eq!(m.v1["cpuacct"], root().join("cpuacct"));
    assert!(!m.v1.contains_key("name=systemd") && !m.v1.contains_key("systemd"));
    assert_eq!(m.v2.as_deref(), Some(root().join("unified").as_path()));
    assert_eq!(m.layout.to_string(), "hybrid");
}

#[test]
fn layout_v1_comounted() {
    let m = parse_layout(V1, root()).unwrap();
    assert_eq!(m.layout, Layout::V1);
    assert_eq!(m.v1["cpu"], root().join("cpu,cpuacct"));
    assert_eq!(m.v1["cpuacct"], root().join("cpu,cpuacct"));
    assert_eq!(m.v2, None);
}

#[test]
fn layout_v2_and_none() {
    let m = parse_layout(V2, root()).unwrap();
    assert_eq!(m.layout, Layout::V2);
    assert!(m.v1.is_empty());
    assert_eq!(
        parse_layout("22 21 0:20 / /proc rw - proc proc rw\n", root()),
        None
    );
    // Mounts elsewhere do not count.
    assert_eq!(parse_layout(V2, Path::new("/other")), None);
}

#[test]
fn parent_paths() {
    assert_eq!(normalize_parent("sandboxd").unwrap(), Path::new("sandboxd"));
    assert_eq!(
        normalize_parent("/system.slice/s.service/sandboxes").unwrap(),
        Path::new("system.slice/s.service/sandboxes")
    );
    for bad in ["", "/", "a/../b", "./a"] {
        assert!(normalize_parent(bad).is_err(), "{bad:?} accepted");
    }
    let r = CgroupRoot::with_root(
        Path::new("/x"),
        Layout::V2,
        "/system.slice/s.service/sandboxes",
    );
    assert_eq!(
        r.relative_path("abc"),
        Path::new("/system.slice/s.service/sandboxes/abc")
    );
    assert!(r.open("../etc").is_err());
}

#[test]
fn a_parent_names_the_same_path_as_a_detected_root() {
    for parent in ["sandboxd", "/system.slice/s.service/sandboxes/"] {
        let p = CgroupParent::new(parent).unwrap();
        let r = CgroupRoot::with_root(Path::new("/x"), Layout::V1, parent);
        assert_eq!(p.relative_path("abc"), r.relative_path("abc"));
    }
    assert_eq!(
        CgroupParent::new("/a/b").unwrap().relative_path("id"),
        Path::new("/a/b/id")
    );
    for bad in ["", "/", "a/../b"] {
        assert!(CgroupParent::new(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn oci_resources_keeps_the_rest_of_its_base() {
    let devices = vec![oci_spec::runtime::LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()
        .unwrap()];
    let mut base = LinuxResources::default();
    base.set_devices(Some(devices.clone()));
    let spec = oci_resources(base, &res(), true).unwrap();
    assert_eq!(spec.devices().as_ref(), Some(&devices));
    assert_eq!(spec.cpu().as_ref().unwrap().period(), Some(CPU_PERIOD_USEC));
    assert_eq!(spec, {
        let mut only = oci_resources(LinuxResources::default(), &res(), true).unwrap();
        only.set_devices(Some(devices));
        only
    });
}

#[test]
fn cpu_quota() {
    assert_eq!(cpu_quota_usec(0.5), Some(50_000));
    assert_eq!(cpu_quota_usec(2.0), Some(200_000));
    assert_eq!(cpu_quota_usec(0.0001), Some(1_000));
    assert_eq!(cpu_quota_usec(0.0), None);
    assert_eq!(cpu_quota_usec(f64::NAN), None);
}

/// A fake v2 cgroup directory with the interface files the kernel makes.
/// Limit files start empty: libcgroups writes without `O_TRUNC`.
fn fake_v2_dir(dir: &Path, controllers: &str, subtree: &str) {
    fs::create_dir_all(dir).unwrap();
    for (name, value) in [
        ("cgroup.controllers", controllers),
        ("cgroup.subtree_control", subtree),
        ("cgroup.procs", ""),
        ("memory.max", ""),
        ("memory.swap.max", ""),
        ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"),
        ("pids.max", ""),
        ("cpu.max", ""),
        ("cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"),
    ] {
        fs::write(dir.join(name), value).unwrap();
    }
}

fn res() -> Resources {
    Resources {
        memory_mb: 64,
        cpus: 0.5,
        pids: 16,
    }
}

#[test]
fn v2_create_writes_limits_and_enables_controllers() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v2_dir(r, "cpuset cpu io memory hugetlb pids", "cpu memory");
    fake_v2_dir(&r.join("svc"), "cpu memory pids", "");
    fake_v2_dir(&r.join("svc/sb"), "cpu memory pids", "cpu memory pids");
    fake_v2_dir(&r.join("svc/sb/abc"), "cpu memory pids", "");
    let root = CgroupRoot::with_root(r, Layout::V2, "/svc/sb");

    let cg = root.create("abc", &res()).unwrap();

    let read = |p: &str| fs::read_to_string(r.join(p)).unwrap();
    assert_eq!(read("cgroup.subtree_control"), "+pids");
    assert_eq!(read("svc/cgroup.subtree_control"), "+cpu +memory +pids");
    assert_eq!(read("svc/sb/cgroup.subtree_control"), "cpu memory pids");
    assert_eq!(read("svc/sb/abc/cgroup.subtree_control"), "");
    assert_eq!(read("svc/sb/abc/memory.max"), (64u64 << 20).to_string());
    assert_eq!(read("svc/sb/abc/memory.swap.max"), "0");
    assert_eq!(read("svc/sb/abc/pids.max"), "16");
    assert_eq!(read("svc/sb/abc/cpu.max"), "50000 100000");
    assert_eq!(
        cg.limits().unwrap(),
        AppliedLimits {
            memory_max_bytes: Some(64 << 20),
            swap_max_bytes: Some(0),
            pids_max: Some(16),
            cpu_quota_usec: Some(50_000),
            cpu_period_usec: 100_000,
        }
    );
    assert!(cg.pids().unwrap().is_empty());
}

#[test]
fn v2_create_refuses_a_busy_leftover() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v2_dir(r, "cpu memory pids", "cpu memory pids");
    fake_v2_dir(&r.join("sandboxd"), "cpu memory pids", "cpu memory pids");
    fake_v2_dir(&r.join("sandboxd/abc"), "cpu memory pids", "");
    fs::write(r.join("sandboxd/abc/cgroup.procs"), "4242\n").unwrap();
    let root = CgroupRoot::with_root(r, Layout::V2, "sandboxd");
    let err = root.create("abc", &res()).unwrap_err();
    assert!(matches!(err, CgroupError::Busy { .. }), "{err}");
    assert_eq!(
        root.open("abc").unwrap().unwrap().pids().unwrap(),
        vec![4242]
    );
    assert!(root.create("a/b", &res()).is_err());
}

#[test]
fn v2_missing_controller_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v2_dir(r, "cpu memory", "");
    fake_v2_dir(&r.join("sandboxd"), "cpu memory", "");
    fake_v2_dir(&r.join("sandboxd/abc"), "cpu memory", "");
    let root = CgroupRoot::with_root(r, Layout::V2, "sandboxd");
    match root.create("abc", &res()) {
        Err(CgroupError::MissingController { controller, .. }) => assert_eq!(controller, "pids"),
        other => panic!("expected MissingController, got {other:?}"),
    }
    // Nothing written before the check failed.
    assert_eq!(
        fs::read_to_string(r.join("cgroup.subtree_control")).unwrap(),
        ""
    );
    let no_pids = Resources { pids: 0, ..res() };
    root.create("abc", &no_pids).unwrap();
    assert_eq!(
        fs::read_to_string(r.join("sandboxd/abc/pids.max")).unwrap(),
        ""
    );
    assert_eq!(
        fs::read_to_string(r.join("sandboxd/cgroup.subtree_control")).unwrap(),
        "+cpu +memory"
    );
}

#[test]
fn v2_counters_and_cgroup_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandboxd/abc");
    fake_v2_dir(&dir, "", "");
    fs::write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\noom_group_kill 9\n",
    )
    .unwrap();
    fs::write(
        dir.join("cpu.stat"),
        "usage_usec 123456\nuser_usec 100000\n",
    )
    .unwrap();
    fs::write(dir.join("cgroup.kill"), "").unwrap();
    let root = CgroupRoot::with_root(tmp.path(), Layout::V2, "sandboxd");
    assert!(root.open("nope").unwrap().is_none());
    let cg = root.open("abc").unwrap().unwrap();
    assert_eq!(cg.oom_kills(), 2);
    assert_eq!(cg.cpu_usage_usec().unwrap(), 123_456);
    cg.kill_all().unwrap();
    assert_eq!(fs::read_to_string(dir.join("cgroup.kill")).unwrap(), "1");
}

#[test]
fn v2_remove_orphans_kills_unknown_spares_known() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    for id in ["known", "orphan"] {
        let dir = r.join("sandboxd").join(id);
        fake_v2_dir(&dir, "", "");
        fs::write(dir.join("cgroup.kill"), "").unwrap();
    }
    let root = CgroupRoot::with_root(r, Layout::V2, "sandboxd");
    assert_eq!(root.list().unwrap(), vec!["known", "orphan"]);
    let known: HashSet<String> = ["known".to_string()].into_iter().collect();
    // A fake directory holds regular files, so rmdir fails: the error
    // names the orphan, after it was killed; the known one is untouched.
    let err = root.remove_orphans(&known).unwrap_err();
    assert!(err.to_string().contains("orphan"), "{err}");
    let kill = |id: &str| fs::read_to_string(r.join("sandboxd").join(id).join("cgroup.kill"));
    assert_eq!(kill("orphan").unwrap(), "1");
    assert_eq!(kill("known").unwrap(), "");
}

#[test]
fn v2_remove_of_a_gone_cgroup_is_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandboxd/abc");
    fake_v2_dir(&dir, "", "");
    let root = CgroupRoot::with_root(tmp.path(), Layout::V2, "sandboxd");
    let cg = root.open("abc").unwrap().unwrap();
    fs::remove_dir_all(&dir).unwrap();
    cg.remove().unwrap();
    assert!(root.open("abc").unwrap().is_none());
    assert!(root.remove_orphans(&HashSet::new()).unwrap().is_empty());
}

/// A fake v1 sandbox directory in `controller`.
fn fake_v1(root: &Path, controller: &str, files: &[(&str, &str)]) {
    let dir = root.join(controller).join("sandboxd/abc");
    fs::create_dir_all(&dir).unwrap();
    for (name, value) in files {
        fs::write(dir.join(name), value).unwrap();
    }
}

#[test]
fn v1_readback_over_fake_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v1(
        r,
        "memory",
        &[
            ("memory.limit_in_bytes", "67108864\n"),
            ("memory.memsw.limit_in_bytes", "67108864\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
            ),
        ],
    );
    fake_v1(r, "pids", &[("pids.max", "16\n")]);
    fake_v1(
        r,
        "cpu",
        &[
            ("cpu.cfs_quota_us", "50000\n"),
            ("cpu.cfs_period_us", "100000\n"),
        ],
    );
    fake_v1(r, "cpuacct", &[("cpuacct.usage", "2500000000\n")]);
    let root = CgroupRoot::with_root(r, Layout::Hybrid, "sandboxd");
    let cg = root.open("abc").unwrap().unwrap();
    assert_eq!(cg.oom_kills(), 4);
    assert_eq!(cg.cpu_usage_usec().unwrap(), 2_500_000);
    assert_eq!(
        cg.limits().unwrap(),
        AppliedLimits {
            memory_max_bytes: Some(64 << 20),
            swap_max_bytes: Some(0),
            pids_max: Some(16),
            cpu_quota_usec: Some(50_000),
            cpu_period_usec: 100_000,
        }
    );
    // Unlimited as v1 spells it.
    fake_v1(
        r,
        "memory",
        &[
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
        ],
    );
    fake_v1(r, "pids", &[("pids.max", "max\n")]);
    fake_v1(r, "cpu", &[("cpu.cfs_quota_us", "-1\n")]);
    let l = cg.limits().unwrap();
    assert_eq!(
        (
            l.memory_max_bytes,
            l.swap_max_bytes,
            l.pids_max,
            l.cpu_quota_usec
        ),
        (None, None, None, None)
    );
    // Joining writes the PID into every controller's directory, listing
    // reads it back (children cgroups included); no libcgroups manager is
    // needed for either (over a fake root there is none).
    let controllers: Vec<String> = fs::read_dir(r)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    // Every controller the root assumes: a missing one fails the join.
    assert!(cg.add_task(42).is_err());
    for c in crate::layout::V1_CONTROLLERS {
        fake_v1(r, c, &[("cgroup.procs", "")]);
    }
    cg.add_task(42).unwrap();
    for c in controllers
        .iter()
        .map(String::as_str)
        .chain(["blkio", "devices", "hugetlb"])
    {
        let f = r.join(c).join("sandboxd/abc/cgroup.procs");
        assert_eq!(fs::read_to_string(&f).unwrap(), "42", "{c}");
    }
    let child = r.join("devices/sandboxd/abc/leftover");
    fs::create_dir_all(&child).unwrap();
    fs::write(child.join("cgroup.procs"), "7\n").unwrap();
    let mut pids = cg.pids().unwrap();
    pids.sort();
    assert_eq!(pids, vec![7, 42]);
}

#[test]
fn listing_finds_sandboxes_in_any_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    for p in [
        "memory/sandboxd/a",
        "pids/sandboxd/b",
        "pids/sandboxd/a",
        "cpu/sandboxd/bad.name",
    ] {
        fs::create_dir_all(r.join(p)).unwrap();
    }
    fs::write(r.join("memory/sandboxd/cgroup.procs"), "").unwrap();
    let root = CgroupRoot::with_root(r, Layout::V1, "sandboxd");
    assert_eq!(root.list().unwrap(), vec!["a".to_string(), "b".to_string()]);
    // Nothing unknown: nothing to do, nothing touched.
    let known: HashSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
    assert!(root.remove_orphans(&known).unwrap().is_empty());

    let tmp2 = tempfile::tempdir().unwrap();
    let v2 = CgroupRoot::with_root(tmp2.path(), Layout::V2, "sandboxd");
    assert!(
        v2.list().unwrap().is_empty(),
        "missing parent is an empty list"
    );
    fs::create_dir_all(tmp2.path().join("sandboxd/x1")).unwrap();
    fs::create_dir_all(tmp2.path().join("other/x2")).unwrap();
    assert_eq!(v2.list().unwrap(), vec!["x1".to_string()]);
}

#[test]
fn daemon_moves_into_leaf() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v2_dir(&r.join("system.slice/s.service/daemon"), "", "");
    let svc = move_to_leaf(r, "0::/system.slice/s.service\n", 77, "daemon").unwrap();
    assert_eq!(svc, Path::new("/system.slice/s.service"));
    let procs = r.join("system.slice/s.service/daemon/cgroup.procs");
    assert_eq!(fs::read_to_string(&procs).unwrap(), "77");
    // Already there: nothing written.
    fs::write(&procs, "").unwrap();
    let svc = move_to_leaf(r, "0::/system.slice/s.service/daemon\n", 77, "daemon").unwrap();
    assert_eq!(svc, Path::new("/system.slice/s.service"));
    assert_eq!(fs::read_to_string(&procs).unwrap(), "");
    assert!(move_to_leaf(r, "4:memory:/x\n", 77, "daemon").is_err());
    assert_eq!(
        move_to_leaf(r, "0::/\n", 77, "daemon").unwrap(),
        Path::new("/")
    );
    assert!(!r.join("daemon").exists());
}

/// A parent inside the unit's own cgroup, where systemd started the
/// daemon: refused (a restart with live sandboxes could not start it);
/// with DelegateSubgroup= (the daemon starts in a leaf), not run by
/// systemd, or not a service's cgroup: allowed.
#[test]
fn a_parent_inside_the_units_own_cgroup_is_refused_under_systemd() {
    let parent = Path::new("/system.slice/s.service/sandboxes");
    let e = started_in_unit_root("/system.slice/s.service", parent, true).unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("219/CGROUP") && msg.contains("DelegateSubgroup=daemon"),
        "{msg}"
    );
    assert!(started_in_unit_root("/system.slice/s.service", parent, false).is_none());
    assert!(started_in_unit_root(
        "/user.slice/x.scope",
        Path::new("/user.slice/x.scope/s"),
        true
    )
    .is_none());
}

#[test]
fn oci_resources_spec() {
    let spec = oci_resources(LinuxResources::default(), &res(), true).unwrap();
    let mem = spec.memory().unwrap();
    assert_eq!(mem.limit(), Some(64 << 20));
    assert_eq!(mem.swap(), Some(64 << 20));
    assert_eq!(spec.pids().unwrap().limit(), 16);
    assert_eq!(spec.cpu().as_ref().unwrap().quota(), Some(50_000));
    let none = oci_resources(
        LinuxResources::default(),
        &Resources {
            memory_mb: 0,
            cpus: 0.0,
            pids: 0,
        },
        false,
    )
    .unwrap();
    assert!(none.memory().is_none() && none.pids().is_none() && none.cpu().is_none());
}

/// Two creates under a new parent: the one that found the parent made (by
/// the other, which has not copied the parent's cpuset yet) fills it from
/// above before copying it into its own directory.
#[test]
fn a_new_cpuset_is_never_left_empty_by_a_concurrent_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("cpuset");
    let parent = top.join("sandboxd-new");
    let dir = parent.join("abc");
    fs::create_dir_all(&dir).unwrap();
    for (d, cpus, mems) in [(&top, "0-1", "0"), (&parent, "", ""), (&dir, "", "")] {
        fs::write(d.join("cpuset.cpus"), cpus).unwrap();
        fs::write(d.join("cpuset.mems"), mems).unwrap();
    }
    crate::root::copy_cpuset(&dir).unwrap();
    for d in [&parent, &dir] {
        assert_eq!(fs::read_to_string(d.join("cpuset.cpus")).unwrap(), "0-1");
        assert_eq!(fs::read_to_string(d.join("cpuset.mems")).unwrap(), "0");
    }
}

/// A fake v2 sandbox cgroup `sandboxd/abc` with the freezer and reclaim
/// files (`cgroup.events` saying `frozen {frozen_event}`): the temporary
/// root, the cgroup's directory and the opened cgroup.
fn fake_v2_hibernation(frozen_event: u8) -> (tempfile::TempDir, PathBuf, SandboxCgroup) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandboxd/abc");
    fake_v2_dir(&dir, "", "");
    for (name, value) in [
        ("cgroup.freeze", "0\n".to_string()),
        (
            "cgroup.events",
            format!("populated 1\nfrozen {frozen_event}\n"),
        ),
        ("memory.current", "104857600\n".into()),
        (
            "memory.stat",
            "anon 94371840\nfile 8388608\nshmem 1048576\n".into(),
        ),
        ("memory.swap.current", "0\n".into()),
        ("memory.swap.max", "0\n".into()),
        ("memory.reclaim", "".into()),
    ] {
        fs::write(dir.join(name), value).unwrap();
    }
    let root = CgroupRoot::with_root(tmp.path(), Layout::V2, "sandboxd");
    let cg = root.open("abc").unwrap().unwrap();
    (tmp, dir, cg)
}

#[test]
fn v2_freeze_waits_for_frozen_and_thaws() {
    let (_tmp, dir, cg) = fake_v2_hibernation(1);
    assert!(!cg.is_frozen().unwrap());
    cg.freeze().unwrap();
    let read = |n: &str| fs::read_to_string(dir.join(n)).unwrap();
    assert_eq!(read("cgroup.freeze"), "1");
    assert!(cg.is_frozen().unwrap());
    cg.thaw().unwrap();
    assert_eq!(read("cgroup.freeze"), "0");
    assert!(!cg.is_frozen().unwrap());
}

#[test]
fn v2_a_freeze_the_kernel_does_not_complete_is_undone() {
    // cgroup.events never says frozen (a task stuck in the kernel).
    let (_tmp, dir, cg) = fake_v2_hibernation(0);
    let e = cg.freeze().unwrap_err().to_string();
    assert!(e.contains("not frozen"), "{e}");
    assert_eq!(
        fs::read_to_string(dir.join("cgroup.freeze")).unwrap(),
        "0",
        "left frozen"
    );
}

#[test]
fn v2_reclaim_opens_swap_for_the_write_only() {
    let (_tmp, dir, cg) = fake_v2_hibernation(1);
    let usage = cg.memory_usage().unwrap();
    assert_eq!(
        usage,
        MemoryUsage {
            bytes: 100 << 20,
            anon: (90 << 20) + (1 << 20),
            swap: 0
        }
    );
    let r = cg.reclaim().unwrap();
    let read = |n: &str| fs::read_to_string(dir.join(n)).unwrap();
    // All it held was asked for; the sandbox's no-swap limit is back.
    assert_eq!(read("memory.reclaim"), (100u64 << 20).to_string());
    assert_eq!(read("memory.swap.max"), "0");
    // A fake file does not move: nothing reclaimed, all anon left.
    assert_eq!(r.reclaimed(), 0);
    assert_eq!(r.anon_left(), usage.anon);
    // Without swap accounting (no memory.swap.max) the write still goes.
    fs::remove_file(dir.join("memory.swap.max")).unwrap();
    fs::write(dir.join("memory.reclaim"), "").unwrap();
    cg.reclaim().unwrap();
    assert_eq!(read("memory.reclaim"), (100u64 << 20).to_string());
}

#[test]
fn v1_freeze_and_reclaim_over_fake_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fake_v1(r, "freezer", &[("freezer.state", "THAWED\n")]);
    fake_v1(
        r,
        "memory",
        &[
            ("memory.usage_in_bytes", "52428800\n"),
            (
                "memory.stat",
                "cache 0\nrss 0\ntotal_cache 4194304\ntotal_rss 41943040\ntotal_shmem 0\ntotal_swap 1048576\n",
            ),
            ("memory.force_empty", ""),
        ],
    );
    let root = CgroupRoot::with_root(r, Layout::Hybrid, "sandboxd");
    let cg = root.open("abc").unwrap().unwrap();
    assert!(!cg.is_frozen().unwrap());
    // A fake file keeps what was written: FROZEN at once.
    cg.freeze().unwrap();
    let state = r.join("freezer/sandboxd/abc/freezer.state");
    assert_eq!(fs::read_to_string(&state).unwrap(), "FROZEN");
    assert!(cg.is_frozen().unwrap());
    let u = cg.memory_usage().unwrap();
    assert_eq!((u.bytes, u.anon, u.swap), (50 << 20, 40 << 20, 1 << 20));
    cg.reclaim().unwrap();
    assert_eq!(
        fs::read_to_string(r.join("memory/sandboxd/abc/memory.force_empty")).unwrap(),
        "0"
    );
    cg.thaw().unwrap();
    assert_eq!(fs::read_to_string(&state).unwrap(), "THAWED");
    assert!(!cg.is_frozen().unwrap());
}
