//! The launch sequence against a recording fake of [`Sys`]: the order of
//! the privileged calls is the table of `docs/architecture.md` ("The
//! launch sequence", "With a user namespace"), a failure at any step stops
//! the sequence there and is reported with that step's name, and the user
//! namespace's holder is reaped whichever step fails after it exists.

use std::cell::RefCell;
use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::sched::CloneFlags;
use nix::unistd::{ForkResult, Pid};

use super::*;
use crate::mounts::Idmap;
use crate::spec::{LinuxDevice, Mount, PosixRlimit, User};
use crate::userns::IdMap;
use sandbox_abi::bpf::Program;
use sandbox_abi::handoff::RootSkeleton;

type Log = Rc<RefCell<Vec<String>>>;

/// Records each call by name (mounts with their destination); fails the
/// call numbered `fail_at` (0-based) with the error the real call gives.
struct Fake {
    config: Vec<u8>,
    log: Log,
    fail_at: Option<usize>,
    fork_parent: bool,
}

struct FakeHolder(Log);

impl Drop for FakeHolder {
    fn drop(&mut self) {
        self.0.borrow_mut().push("reap_holder".into());
    }
}

fn mount_err(p: &Path) -> InitError {
    InitError::Mount {
        step: "fake",
        path: p.to_path_buf(),
        message: "refused".into(),
    }
}

impl Fake {
    fn new(config: String) -> Fake {
        Fake {
            config: config.into_bytes(),
            log: Rc::default(),
            fail_at: None,
            fork_parent: false,
        }
    }

    /// Records `name`; `Err(e)` when this call is the one to fail.
    fn call(&mut self, name: String, e: impl FnOnce() -> InitError) -> Result<(), InitError> {
        let n = {
            let mut log = self.log.borrow_mut();
            log.push(name);
            log.iter().filter(|c| *c != "reap_holder").count() - 1
        };
        match self.fail_at {
            Some(k) if k == n => Err(e()),
            _ => Ok(()),
        }
    }
}

const EPERM: nix::Error = nix::errno::Errno::EPERM;

impl Sys for Fake {
    type Slaves = ();
    type Holder = FakeHolder;

    fn read_config(&mut self, _: &Path) -> std::io::Result<Vec<u8>> {
        self.call("read_config".into(), || InitError::Spec(String::new()))
            .map_err(|_| std::io::Error::other("refused"))?;
        Ok(self.config.clone())
    }
    fn load_seccomp(
        &mut self,
        bpf: Option<&Path>,
        _: &Path,
        _: bool,
    ) -> Result<Option<Vec<Program>>, InitError> {
        assert!(bpf.is_some());
        self.call("load_seccomp".into(), || {
            InitError::Seccomp("refused".into())
        })?;
        Ok(Some(Vec::new()))
    }
    fn join_cgroup(&mut self, p: &Path) -> Result<(), InitError> {
        assert_eq!(p, Path::new("/sandboxd/abc"));
        self.call("join_cgroup".into(), || {
            InitError::JoinCgroup("refused".into())
        })
    }
    fn open_slaves(&mut self, _: &[Mount]) -> Result<(), InitError> {
        self.call("open_slaves".into(), || mount_err(Path::new("/")))
    }
    fn create_userns(
        &mut self,
        _: &[IdMap],
        _: &[IdMap],
        owner: u32,
    ) -> Result<(OwnedFd, FakeHolder), InitError> {
        assert_eq!(owner, 100_000);
        self.call("create_userns".into(), || {
            InitError::Userns("refused".into())
        })?;
        let fd = std::fs::File::open("/dev/null").unwrap();
        Ok((fd.into(), FakeHolder(self.log.clone())))
    }
    fn unshare(&mut self, flags: CloneFlags) -> Result<(), InitError> {
        let name = if flags == CloneFlags::CLONE_NEWNS {
            "unshare_mount"
        } else {
            assert!(!flags.contains(CloneFlags::CLONE_NEWUSER));
            assert!(flags.contains(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWCGROUP));
            "unshare"
        };
        self.call(name.into(), || InitError::Unshare(EPERM))
    }
    fn make_private(&mut self) -> Result<(), InitError> {
        self.call("make_private".into(), || InitError::MakePrivate(EPERM))
    }
    fn root_tmpfs(&mut self, r: &Path, _: &RootSkeleton) -> Result<(), InitError> {
        self.call("root_tmpfs".into(), || mount_err(r))
    }
    fn bind_rootfs(&mut self, r: &Path) -> Result<(), InitError> {
        self.call("bind_rootfs".into(), || mount_err(r))
    }
    fn mount(
        &mut self,
        _: &Path,
        m: &Mount,
        _: Option<&mut ()>,
        _: Option<&Idmap<'_>>,
    ) -> Result<(), InitError> {
        let d = m.destination().clone();
        self.call(format!("mount {}", d.display()), || mount_err(&d))
    }
    fn make_mount_point(&mut self, t: &Path) -> Result<(), InitError> {
        let name = t.file_name().unwrap().to_string_lossy().to_string();
        self.call(format!("mount_point {name}"), || mount_err(t))
    }
    fn create_devices(
        &mut self,
        r: &Path,
        _: &[LinuxDevice],
        _: Option<&[IdMap]>,
        _: Option<&[IdMap]>,
    ) -> Result<(), InitError> {
        self.call("create_devices".into(), || mount_err(r))
    }
    fn remount_readonly(&mut self, r: &Path) -> Result<(), InitError> {
        self.call("remount_readonly".into(), || mount_err(r))
    }
    fn chdir(&mut self, d: &Path) -> Result<(), InitError> {
        self.call("chdir".into(), || mount_err(d))
    }
    fn set_rlimits(&mut self, _: &[PosixRlimit]) -> Result<(), InitError> {
        self.call("set_rlimits".into(), || InitError::Rlimit("refused".into()))
    }
    fn set_oom_score_adj(&mut self, score: i32) -> Result<(), InitError> {
        assert_eq!(score, -500);
        self.call("set_oom_score_adj".into(), || {
            InitError::OomScoreAdj("refused".into())
        })
    }
    fn enter_userns(&mut self, _: OwnedFd) -> Result<(), InitError> {
        self.call("enter_userns".into(), || {
            InitError::Userns("refused".into())
        })
    }
    fn fork(&mut self) -> Result<ForkResult, InitError> {
        self.call("fork".into(), || InitError::Fork(EPERM))?;
        Ok(if self.fork_parent {
            ForkResult::Parent {
                child: Pid::from_raw(4242),
            }
        } else {
            ForkResult::Child
        })
    }
    fn reattach_cwd(&mut self, r: &Path) -> Result<(), InitError> {
        self.call("reattach_cwd".into(), || mount_err(r))
    }
    fn pivot(&mut self, r: &Path) -> Result<(), InitError> {
        self.call("pivot".into(), || mount_err(r))
    }
    fn mask(&mut self, p: &Path) -> Result<(), InitError> {
        self.call("mask".into(), || mount_err(p))
    }
    fn make_readonly(&mut self, p: &Path) -> Result<(), InitError> {
        self.call("make_readonly".into(), || mount_err(p))
    }
    fn readonly_root(&mut self) -> Result<(), InitError> {
        self.call("readonly_root".into(), || mount_err(Path::new("/")))
    }
    fn sethostname(&mut self, name: &str) -> Result<(), InitError> {
        assert_eq!(name, "sbx-abc");
        self.call("sethostname".into(), || InitError::Hostname(EPERM))
    }
    fn loopback_up(&mut self) -> Result<(), InitError> {
        self.call("loopback_up".into(), || {
            InitError::Loopback("refused".into())
        })
    }
    fn umask(&mut self, mask: u32) {
        assert_eq!(mask, 0o077);
        self.log.borrow_mut().push("umask".into());
    }
    fn close_other_fds(&mut self, keep: Option<RawFd>) -> Result<(), InitError> {
        assert_eq!(keep, Some(4));
        self.call("close_other_fds".into(), || {
            InitError::CloseFds("refused".into())
        })
    }
    fn drop_inheritable_caps(&mut self) -> Result<(), InitError> {
        self.call("drop_inheritable_caps".into(), || {
            InitError::DropCaps("refused".into())
        })
    }
    fn switch_user(&mut self, user: &User, may_setgroups: bool) -> Result<(), InitError> {
        assert_eq!((user.uid(), user.gid()), (1000, 1000));
        let name = if may_setgroups {
            "switch_user"
        } else {
            "switch_user_no_setgroups"
        };
        self.call(name.into(), || InitError::SwitchUser("refused".into()))
    }
    fn verify_no_caps(&mut self) -> Result<(), InitError> {
        self.call("verify_no_caps".into(), || {
            InitError::DropCaps("refused".into())
        })
    }
    fn enter_workdir(&mut self, cwd: &Path) -> Result<(), InitError> {
        self.call("enter_workdir".into(), || InitError::Chdir {
            path: cwd.to_path_buf(),
            source: rustix::io::Errno::LOOP,
        })
    }
    fn no_new_privs(&mut self) -> Result<(), InitError> {
        self.call("no_new_privs".into(), || InitError::NoNewPrivs(EPERM))
    }
    fn install_seccomp(&mut self, _: &[Program]) -> Result<(), InitError> {
        self.call("install_seccomp".into(), || {
            InitError::Seccomp("refused".into())
        })
    }
    fn exec(&mut self, path: &CString, argv: &[CString], envp: &[CString]) -> InitError {
        assert_eq!(path, &argv[0]);
        assert!(envp
            .iter()
            .any(|e| e.to_str() == Ok("SANDBOX_AGENT_READY_FD=4")));
        // The fake cannot become the payload: exec always "fails" here.
        let _ = self.call("exec".into(), || InitError::Spec(String::new()));
        InitError::Exec {
            path: path.to_string_lossy().to_string(),
            source: nix::errno::Errno::ENOEXEC,
        }
    }
}

/// The shipped base spec with what a create adds: hostname, cgroup path,
/// the root skeleton, an OOM score; with `userns`, the user namespace and
/// its maps.
fn config(userns: bool) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(include_str!("../../../oci/base.json")).unwrap();
    v["hostname"] = "sbx-abc".into();
    v["annotations"] = serde_json::json!({
        sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION:
            serde_json::to_string(&RootSkeleton::default()).unwrap()
    });
    v["process"]["oomScoreAdj"] = (-500).into();
    v["linux"]["cgroupsPath"] = "/sandboxd/abc".into();
    if userns {
        v["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .insert(0, serde_json::json!({"type": "user"}));
        for k in ["uidMappings", "gidMappings"] {
            v["linux"][k] =
                serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        }
    }
    v.to_string()
}

fn args() -> Args {
    Args {
        bundle: PathBuf::from("/bundle"),
        report_fd: None,
        ready_fd: Some(4),
        seccomp_bpf: Some(PathBuf::from("/state/seccomp.bpf")),
        probe_idmap: Vec::new(),
        probe_base: 0,
    }
}

fn run(fake: &mut Fake) -> Result<Launched, InitError> {
    launch(fake, &args(), &Reporter::none())
}

/// The mounts of the base spec, by destination, and the deferred ones.
fn spec_mounts() -> Vec<(String, bool)> {
    let s: Spec = serde_json::from_str(&config(false)).unwrap();
    s.mounts()
        .clone()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m.destination().display().to_string(),
                mounts::is_deferred(m),
            )
        })
        .collect()
}

fn spec_paths() -> (usize, usize) {
    let s: Spec = serde_json::from_str(&config(false)).unwrap();
    let l = s.linux().clone().unwrap();
    (
        l.masked_paths().clone().unwrap().len(),
        l.readonly_paths().clone().unwrap().len(),
    )
}

/// The calls of a launch without a user namespace, each with the row of
/// the documented table it belongs to and a word of that row.
fn expected_plain() -> Vec<(String, &'static str, &'static str)> {
    let mut v: Vec<(String, &str, &str)> = vec![
        ("read_config".into(), "1", "config.json"),
        ("load_seccomp".into(), "3", "seccomp"),
        ("join_cgroup".into(), "4", "join the cgroup"),
        ("open_slaves".into(), "4", ""),
        ("unshare".into(), "5", "unshare"),
        ("fork".into(), "6", "fork"),
        ("make_private".into(), "7", "make-rprivate"),
        ("root_tmpfs".into(), "8", ""),
        ("bind_rootfs".into(), "8", "bind the rootfs"),
    ];
    for (d, _) in spec_mounts() {
        v.push((format!("mount {d}"), "8", "mount table"));
    }
    v.push(("create_devices".into(), "8", "device nodes"));
    v.push(("pivot".into(), "9", "pivot_root"));
    let (masked, ro) = spec_paths();
    v.extend((0..masked).map(|_| ("mask".into(), "10", "masked paths")));
    v.extend((0..ro).map(|_| ("make_readonly".into(), "10", "read-only paths")));
    v.extend([
        ("readonly_root".into(), "10", "remount `/` read-only"),
        ("sethostname".into(), "11", "sethostname"),
        ("loopback_up".into(), "11", "`lo` up"),
        ("set_rlimits".into(), "12", "rlimits"),
        ("umask".into(), "12", "umask"),
        ("set_oom_score_adj".into(), "13", "oomScoreAdj"),
        ("close_other_fds".into(), "14", "close-on-exec"),
        ("drop_inheritable_caps".into(), "15", "bounding"),
        ("switch_user".into(), "15", "setresuid"),
        ("verify_no_caps".into(), "15", "verify"),
        ("enter_workdir".into(), "16", "openat2"),
        ("no_new_privs".into(), "17", "no_new_privs"),
        ("install_seccomp".into(), "18", "seccomp filters"),
        ("exec".into(), "19", "execve"),
    ]);
    v
}

/// The same with a user namespace (the second table replaces steps 5-9
/// and sets rlimits and the OOM score before the join).
fn expected_userns() -> Vec<(String, &'static str, &'static str)> {
    let mut v: Vec<(String, &str, &str)> = vec![
        ("read_config".into(), "1", "config.json"),
        ("load_seccomp".into(), "3", "seccomp"),
        ("join_cgroup".into(), "4", "join the cgroup"),
        ("open_slaves".into(), "4", ""),
        ("create_userns".into(), "5u.1", "holder"),
        ("unshare_mount".into(), "5u.2", "unshare(CLONE_NEWNS)"),
        ("make_private".into(), "5u.2", "rprivate"),
        ("root_tmpfs".into(), "5u.2", ""),
        ("bind_rootfs".into(), "5u.2", "bind the rootfs"),
    ];
    for (d, deferred) in spec_mounts() {
        if deferred {
            let name = Path::new(&d)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .to_string();
            v.push((format!("mount_point {name}"), "5u.2", "mount points only"));
        } else {
            v.push((format!("mount {d}"), "5u.2", "move_mount"));
        }
    }
    v.extend([
        ("create_devices".into(), "5u.2", "device nodes"),
        ("remount_readonly".into(), "5u.2", "remounted read-only"),
        ("chdir".into(), "5u.2", "`chdir` into it"),
        ("set_rlimits".into(), "5u.3", "rlimits"),
        ("set_oom_score_adj".into(), "5u.3", "oom_score_adj"),
        (
            "enter_userns".into(),
            "5u.4",
            "`setns` into the user namespace",
        ),
        ("unshare".into(), "5u.4", "`unshare` the other namespaces"),
        ("reap_holder".into(), "5u.1", "let the holder exit"),
        ("fork".into(), "6", "fork"),
    ]);
    for (d, deferred) in spec_mounts() {
        if deferred {
            v.push((
                format!("mount {d}"),
                "8u",
                "`proc`, `sysfs`, `mqueue`, `devpts`",
            ));
        }
    }
    v.push(("reattach_cwd".into(), "8u", "`open_tree` of `.`"));
    v.push(("pivot".into(), "9", "pivot_root"));
    let (masked, ro) = spec_paths();
    v.extend((0..masked).map(|_| ("mask".into(), "10", "masked paths")));
    v.extend((0..ro).map(|_| ("make_readonly".into(), "10", "read-only paths")));
    v.extend([
        ("readonly_root".into(), "10", "remount `/` read-only"),
        ("sethostname".into(), "11", "sethostname"),
        ("loopback_up".into(), "11", "`lo` up"),
        ("umask".into(), "12", "umask"),
        ("close_other_fds".into(), "14", "close-on-exec"),
        ("drop_inheritable_caps".into(), "15", "bounding"),
        ("switch_user_no_setgroups".into(), "15", "setresuid"),
        ("verify_no_caps".into(), "15", "verify"),
        ("enter_workdir".into(), "16", "openat2"),
        ("no_new_privs".into(), "17", "no_new_privs"),
        ("install_seccomp".into(), "18", "seccomp filters"),
        ("exec".into(), "19", "execve"),
    ]);
    v
}

/// The rows of the launch sequence's two tables in docs/architecture.md,
/// `(number, text)`, in document order.
fn doc_rows() -> Vec<(String, String)> {
    let doc = include_str!("../../../docs/architecture.md");
    let start = doc
        .find("## The launch sequence")
        .expect("the launch sequence section");
    let end = start + doc[start..].find("\n## Report and ready channels").unwrap();
    doc[start..end]
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let n = cells.first()?.strip_prefix("| ")?.trim();
            (cells.len() >= 3 && n != "#" && !n.starts_with("---"))
                .then(|| (n.to_string(), cells[1..].join(" | ")))
        })
        .collect()
}

/// Every call names a row of the documented tables whose text says what
/// the call does, and the calls come in the tables' order (the user
/// namespace's rows stand between steps 4 and 6, 8u before 9).
fn check_against_doc(expected: &[(String, &str, &str)]) {
    let rows = doc_rows();
    let rank = |n: &str| -> usize {
        let order = [
            "1", "2", "3", "4", "5u.1", "5u.2", "5u.3", "5u.4", "5", "6", "7", "8u", "8", "9",
            "10", "11", "12", "13", "14", "15", "16", "17", "18", "19",
        ];
        order.iter().position(|o| *o == n).expect(n)
    };
    let mut last = 0;
    for (call, n, word) in expected {
        let (_, text) = rows
            .iter()
            .find(|(r, _)| r == n)
            .unwrap_or_else(|| panic!("docs/architecture.md has no row {n} (for {call})"));
        assert!(
            text.contains(word),
            "row {n} of docs/architecture.md does not say {word:?} (for {call}): {text}"
        );
        // The holder is reaped once its namespace is joined: that is the
        // end of 5u.4, whatever row names it.
        if call != "reap_holder" {
            let r = rank(n);
            assert!(r >= last, "{call} (row {n}) comes after a later row");
            last = r;
        }
    }
}

fn names(v: &[(String, &str, &str)]) -> Vec<String> {
    v.iter().map(|(c, _, _)| c.clone()).collect()
}

#[test]
fn the_calls_follow_the_documented_table() {
    let expected = expected_plain();
    check_against_doc(&expected);
    let mut fake = Fake::new(config(false));
    let e = run(&mut fake).unwrap_err();
    assert_eq!(e.step(), "exec");
    assert_eq!(*fake.log.borrow(), names(&expected));
}

#[test]
fn with_a_user_namespace_the_calls_follow_the_documented_table() {
    let expected = expected_userns();
    check_against_doc(&expected);
    // ... where the switch to the sandbox user skips setgroups.
    let rows = doc_rows();
    let (_, text) = rows.iter().find(|(n, _)| n == "12–15").unwrap();
    assert!(text.contains("`setgroups` skipped"), "{text}");
    let mut fake = Fake::new(config(true));
    let e = run(&mut fake).unwrap_err();
    assert_eq!(e.step(), "exec");
    assert_eq!(*fake.log.borrow(), names(&expected));
}

/// The step a failed call is reported as (`sandbox-init failed at step
/// <step>`).
fn step_of(call: &str) -> &'static str {
    match call.split(' ').next().unwrap() {
        "read_config" => "load_spec",
        "load_seccomp" | "install_seccomp" => "seccomp",
        "join_cgroup" => "join_cgroup",
        "create_userns" | "enter_userns" => "userns",
        "unshare" | "unshare_mount" => "unshare",
        "fork" => "fork",
        "make_private" => "make_private",
        "sethostname" => "hostname",
        "loopback_up" => "loopback",
        "set_rlimits" => "rlimits",
        "set_oom_score_adj" => "oom_score_adj",
        "close_other_fds" => "close_fds",
        "drop_inheritable_caps" | "verify_no_caps" => "drop_caps",
        "switch_user" | "switch_user_no_setgroups" => "switch_user",
        "enter_workdir" => "chdir",
        "no_new_privs" => "no_new_privs",
        "exec" => "exec",
        _ => "mount",
    }
}

/// A failure at any call stops the sequence there (no later call is
/// made) and is reported as that call's step; with a user namespace the
/// holder is reaped on the way out once it exists.
#[test]
fn a_failure_at_any_step_stops_the_sequence_there() {
    for userns in [false, true] {
        let all = names(&if userns {
            expected_userns()
        } else {
            expected_plain()
        });
        let calls: Vec<&String> = all
            .iter()
            .filter(|c| *c != "reap_holder" && *c != "umask")
            .collect();
        for (k, failing) in calls.iter().enumerate() {
            let mut fake = Fake::new(config(userns));
            let n = all.iter().position(|c| c == *failing).unwrap();
            // The call's index among the calls the fake counts.
            fake.fail_at = Some(all[..n].iter().filter(|c| *c != "reap_holder").count());
            let e = run(&mut fake).unwrap_err();
            assert_eq!(
                e.step(),
                step_of(failing),
                "userns {userns}, call {k} {failing}"
            );
            let log = fake.log.borrow().clone();
            let made: Vec<&String> = log.iter().filter(|c| *c != "reap_holder").collect();
            let upto: Vec<&String> = all[..=n].iter().filter(|c| *c != "reap_holder").collect();
            assert_eq!(made, upto, "userns {userns}: after {failing} failed");
            let holder_made =
                log.iter().any(|c| c == "create_userns") && *failing != "create_userns";
            assert_eq!(
                log.iter().filter(|c| *c == "reap_holder").count(),
                usize::from(holder_made),
                "userns {userns}, {failing}: {log:?}"
            );
        }
    }
}

/// The parent reports the child's PID on the report channel and stops:
/// nothing of the child's steps runs in it.
#[test]
fn the_parent_reports_the_pid_and_stops() {
    let (r, w) = nix::unistd::pipe().unwrap();
    // SAFETY: `w` is a fresh pipe end owned by nothing else once released.
    let reporter = unsafe { Reporter::from_raw(std::os::fd::IntoRawFd::into_raw_fd(w)) };
    let mut fake = Fake::new(config(false));
    fake.fork_parent = true;
    assert_eq!(
        launch(&mut fake, &args(), &reporter).unwrap(),
        Launched::Parent
    );
    drop(reporter);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
    assert_eq!(out.trim(), r#"{"pid":4242}"#);
    let log = fake.log.borrow();
    assert_eq!(log.last().map(String::as_str), Some("fork"));
}

/// Without the `compile` feature a bundle with a profile and no compiled
/// stack is refused at the seccomp step (never run unfiltered); with it,
/// the profile is compiled to the daemon's bytes for the default profile.
#[test]
fn a_profile_without_a_compiled_stack() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&config(false)).unwrap();
    let profile: serde_json::Value =
        serde_json::from_str(include_str!("../../../seccomp/default.json")).unwrap();
    v["linux"]["seccomp"] = profile;
    std::fs::write(&cfg, v.to_string()).unwrap();
    let got = compile_seccomp(&cfg, true);
    #[cfg(not(feature = "compile"))]
    {
        let e = got.unwrap_err();
        assert_eq!(e.step(), "seccomp");
        assert!(e.to_string().contains("--seccomp-bpf"), "{e}");
    }
    #[cfg(feature = "compile")]
    {
        let programs = got.unwrap().unwrap();
        let (_, _, daemon) = sandbox_seccomp::load_and_compile(None).unwrap();
        assert_eq!(programs, sandbox_seccomp::wire::programs(&daemon));
    }
    // No profile: nothing to install, either way.
    assert!(compile_seccomp(&cfg, false).unwrap().is_none() || cfg!(feature = "compile"));
}
