//! Privileged tests of `sandboxd::cgroups` on the real cgroup filesystem:
//! limits read back from the kernel's files, pids.max refusing forks, an
//! OOM kill counted, a CPU quota holding, kill/remove leaving nothing, and
//! orphan removal. Each test uses its own random parent cgroup and removes
//! it. Skips (printing why) when not root or without a cgroup filesystem.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use sandboxd::cgroups::{CgroupRoot, Layout, SandboxCgroup};
use sandboxd::model::Resources;

const LIMITS: Resources = Resources {
    memory_mb: 64,
    cpus: 0.5,
    pids: 16,
};

/// No limit at all: the unified hierarchy of a hybrid host has no
/// controllers.
const NO_LIMITS: Resources = Resources {
    memory_mb: 0,
    cpus: 0.0,
    pids: 0,
};

/// A test parent cgroup, removed (with everything in it) on drop.
struct TestRoot {
    root: CgroupRoot,
    parent: String,
}

impl TestRoot {
    fn new() -> Option<TestRoot> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: cgroup tests need root");
            return None;
        }
        if !Path::new("/sys/fs/cgroup").is_dir() {
            eprintln!("SKIP: no cgroup filesystem at /sys/fs/cgroup");
            return None;
        }
        let parent = format!("sandboxd-test-{:08x}", (sandbox_abi::random::u64() as u32));
        let root = match CgroupRoot::detect(&parent) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("SKIP: cannot detect the cgroup layout: {e}");
                return None;
            }
        };
        let layout = match root.layout() {
            Layout::V1 => "v1",
            Layout::V2 => "v2",
            Layout::Hybrid => "hybrid",
        };
        println!("cgroup layout: {layout}");
        Some(TestRoot { root, parent })
    }

    /// The directories of `id` (or of the parent when `None`) in every
    /// hierarchy under /sys/fs/cgroup.
    fn dirs(&self, id: Option<&str>) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let rel = match id {
            Some(id) => format!("{}/{id}", self.parent),
            None => self.parent.clone(),
        };
        if self.root.layout() == Layout::V2 {
            out.push(Path::new("/sys/fs/cgroup").join(&rel));
        } else {
            for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
                out.push(e.path().join(&rel));
            }
        }
        out
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        let _ = self.root.remove_orphans(&HashSet::new());
        for d in self.dirs(None) {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// A directory removed (`rmdir`) on drop: a test parent made outside
/// [`TestRoot`]'s hierarchies.
struct Rm(PathBuf);

impl Drop for Rm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `sh -c "read go; <script>"`: held until [`release`] so that it can be
/// moved into the cgroup before it does anything.
fn gated(script: &str) -> (Child, ChildStdin) {
    gated_to(script, Stdio::null())
}

/// [`gated`] with its stdout going to `stdout`.
fn gated_to(script: &str, stdout: Stdio) -> (Child, ChildStdin) {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("read go; {script}"))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    (child, stdin)
}

fn release(mut stdin: ChildStdin) {
    stdin.write_all(b"go\n").unwrap();
}

fn enter(cg: &SandboxCgroup, child: &Child) {
    cg.add_task(child.id() as i32).unwrap();
    assert!(cg.pids().unwrap().contains(&(child.id() as i32)));
}

fn id(prefix: &str) -> String {
    format!(
        "{prefix}-{:06x}",
        (sandbox_abi::random::u64() as u32) & 0xff_ffff
    )
}

#[test]
fn limits_kill_and_remove() {
    let Some(t) = TestRoot::new() else { return };
    let sid = id("lim");
    let cg = t.root.create(&sid, &LIMITS).unwrap();
    assert_eq!(t.root.open(&sid).unwrap().unwrap().sandbox_id(), sid);

    let l = cg.limits().unwrap();
    println!("applied limits: {l:?}");
    assert_eq!(l.memory_max_bytes, Some(64 << 20));
    assert_eq!(l.swap_max_bytes, Some(0), "swap must be disabled");
    assert_eq!(l.pids_max, Some(16));
    assert_eq!(l.cpu_quota_usec, Some(50_000));
    assert_eq!(l.cpu_period_usec, 100_000);

    let mut kids: Vec<Child> = (0..3)
        .map(|_| Command::new("sleep").arg("30").spawn().unwrap())
        .collect();
    for k in &kids {
        enter(&cg, k);
    }
    assert_eq!(cg.pids().unwrap().len(), 3);
    assert_eq!(t.root.list().unwrap(), vec![sid.clone()]);

    let start = Instant::now();
    cg.kill_all().unwrap();
    println!("kill_all took {:?}", start.elapsed());
    assert!(cg.pids().unwrap().is_empty());
    for k in &mut kids {
        let st = k.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    }
    let second_handle = t.root.open(&sid).unwrap().unwrap();
    cg.remove().unwrap();
    for d in t.dirs(Some(&sid)) {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    second_handle.remove().expect("remove must be idempotent");
    assert!(t.root.open(&sid).unwrap().is_none());
    assert!(t.root.list().unwrap().is_empty());
}

#[test]
fn pids_max_refuses_forks() {
    let Some(t) = TestRoot::new() else { return };
    let sid = id("pids");
    let cg = t.root.create(&sid, &LIMITS).unwrap();
    let (mut sh, go) = gated("i=0; while [ $i -lt 50 ]; do sleep 30 & i=$((i+1)); done; wait");
    enter(&cg, &sh);
    release(go);
    // The shell stops at the first refused fork (dash: "Cannot fork").
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let in_cg = cg.pids().unwrap().len();
    cg.kill_all().unwrap();
    let status = sh.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sh.stderr.take().unwrap(), &mut err).unwrap();
    println!("shell: {status}, {in_cg} processes in the cgroup, stderr: {err:?}");
    let err = err.to_lowercase();
    assert!(
        err.contains("fork") || err.contains("resource temporarily unavailable"),
        "no fork failure reported"
    );
    assert!(!status.success());
    assert!((2..=16).contains(&in_cg), "{in_cg} processes in the cgroup");
    cg.remove().unwrap();
}

#[test]
fn memory_hog_is_oom_killed() {
    let Some(t) = TestRoot::new() else { return };
    let sid = id("oom");
    let cg = t.root.create(&sid, &LIMITS).unwrap();
    assert_eq!(cg.oom_kills(), 0);
    let (mut sh, go) = gated("head -c 300M /dev/zero | tail > /dev/null");
    enter(&cg, &sh);
    release(go);
    let status = sh.wait().unwrap();
    let oom = cg.oom_kills();
    println!("hog: {status}, oom_kills = {oom}");
    assert!(!status.success(), "the 300 MiB hog survived a 64 MiB limit");
    assert!(oom >= 1, "oom_kills = {oom}");
    cg.kill_all().unwrap();
    cg.remove().unwrap();
}

#[test]
fn cpu_quota_holds() {
    let Some(t) = TestRoot::new() else { return };
    let sid = id("cpu");
    let cg = t.root.create(&sid, &LIMITS).unwrap();
    let (_sh, go) = gated("while :; do :; done");
    enter(&cg, &_sh);
    release(go);
    std::thread::sleep(Duration::from_millis(300));
    let (u0, t0) = (cg.cpu_usage_usec().unwrap(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (u1, wall) = (cg.cpu_usage_usec().unwrap(), t0.elapsed());
    cg.kill_all().unwrap();
    let ratio = (u1 - u0) as f64 / wall.as_micros() as f64;
    println!("cpu ratio at cpus=0.5: {ratio:.3}");
    assert!(ratio <= 0.65, "spinner used {ratio:.3} CPU");
    assert!(ratio >= 0.15, "spinner not accounted ({ratio:.3} CPU)");
    cg.remove().unwrap();
}

#[test]
fn orphans_removed_known_spared() {
    let Some(t) = TestRoot::new() else { return };
    let (orphan, known) = (id("orphan"), id("known"));
    let o = t.root.create(&orphan, &LIMITS).unwrap();
    let k = t.root.create(&known, &LIMITS).unwrap();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    enter(&o, &sleeper);
    drop(o);

    let keep: HashSet<String> = [known.clone()].into_iter().collect();
    let removed = t.root.remove_orphans(&keep).unwrap();
    assert_eq!(removed, vec![orphan.clone()]);
    let st = sleeper.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    for d in t.dirs(Some(&orphan)) {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    assert_eq!(t.root.list().unwrap(), vec![known.clone()]);
    assert!(t.root.open(&known).unwrap().is_some());
    k.kill_all().unwrap();
    k.remove().unwrap();
}

/// On a hybrid host the (controller-less) unified hierarchy still has
/// `cgroup.kill`, `cgroup.procs` and `cpu.stat`: exercises the v2 code paths
/// against the real kernel, without limits.
#[test]
fn v2_paths_on_the_unified_hierarchy() {
    let Some(t) = TestRoot::new() else { return };
    if t.root.layout() != Layout::Hybrid {
        println!("SKIP: not hybrid; the v2 paths are covered by the other tests");
        return;
    }
    let unified = Path::new("/sys/fs/cgroup/unified");
    let v2 = CgroupRoot::with_root(unified, Layout::V2, &t.parent);
    let _rm = Rm(unified.join(&t.parent));

    // memory is bound to v1 here: refused before anything is created.
    let err = v2.create("nomem", &LIMITS).unwrap_err();
    println!("unified with limits: {err}");
    assert!(matches!(
        err,
        sandboxd::cgroups::CgroupError::MissingController { .. }
    ));
    assert!(!unified.join(&t.parent).join("nomem").exists());

    let sid = id("v2");
    let cg = v2.create(&sid, &NO_LIMITS).unwrap();
    let dir = unified.join(&t.parent).join(&sid);
    assert!(
        dir.join("cgroup.kill").exists(),
        "kernel without cgroup.kill"
    );
    let mut kids = vec![Command::new("sleep").arg("30").spawn().unwrap()];
    let (spin, go) = gated("while :; do :; done");
    kids.push(spin);
    for k in &kids {
        enter(&cg, k);
    }
    release(go);
    // The spinner's time shows in cpu.stat: wait for 50 ms of it.
    let end = Instant::now() + Duration::from_secs(30);
    let mut used = cg.cpu_usage_usec().unwrap();
    while used < 50_000 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        used = cg.cpu_usage_usec().unwrap();
    }
    println!("v2 cpu.stat usage_usec of the spinner: {used}");
    assert!(used >= 50_000, "usage_usec = {used} after 30 s of spinning");
    assert_eq!(v2.list().unwrap(), vec![sid.clone()]);

    cg.kill_all().unwrap();
    for k in &mut kids {
        let st = k.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    }
    cg.remove().unwrap();
    assert!(!dir.exists());
    assert!(v2.open(&sid).unwrap().is_none());
}

/// The v2 device program (`sandboxd::cgroups::bpf`) built from the
/// shipped base spec's allow-list, attached by `create` to a cgroup of the
/// v2 hierarchy: the kernel runs it for every task in that cgroup, also on
/// a hybrid host (the unified hierarchy's cgroup of a task is where its
/// BPF programs come from, controllers or not). A root shell with every
/// capability in it keeps `/dev/null`, `/dev/zero` and `/dev/urandom` and
/// the `mknod` of an allowed node, and is refused (EPERM, by the cgroup:
/// the same shell outside it is not) the `mknod` of a block device and
/// the opening of nodes outside the list. Fails (not skips) when the
/// kernel refuses the program.
#[test]
fn the_device_program_enforces_the_allow_list() {
    let Some(t) = TestRoot::new() else { return };
    let v2_mount = match t.root.layout() {
        Layout::V2 => PathBuf::from("/sys/fs/cgroup"),
        Layout::Hybrid => PathBuf::from("/sys/fs/cgroup/unified"),
        Layout::V1 => {
            println!("SKIP: no cgroup v2 hierarchy on this v1 host");
            return;
        }
    };
    let base: oci_spec::runtime::Spec =
        serde_json::from_str(include_str!("../../oci/base.json")).unwrap();
    let v2 = CgroupRoot::with_root(&v2_mount, Layout::V2, &t.parent).with_spec_device_rules(&base);
    assert!(
        v2.enforces_devices(),
        "the kernel refused the device program (see the log above)"
    );
    let _rm = Rm(v2_mount.join(&t.parent));
    let sid = id("dev");
    let cg = v2.create(&sid, &NO_LIMITS).unwrap();
    let dir = cg.v2_dir().unwrap().to_path_buf();
    let progs = sandboxd::cgroups::bpf::attached(&dir).unwrap();
    assert_eq!(progs.len(), 1, "programs attached to {}", dir.display());

    // Nodes outside the list, made from outside the cgroup (no nodev
    // mount in the way: the test's tempdir).
    let scratch = tempfile::tempdir().unwrap();
    let s = scratch.path();
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let rw = Mode::from_bits_truncate(0o666);
    mknod(&s.join("tun"), SFlag::S_IFCHR, rw, makedev(10, 200)).unwrap();
    mknod(&s.join("loop"), SFlag::S_IFBLK, rw, makedev(7, 0)).unwrap();
    let script = format!(
        "echo x > /dev/null; echo \"null rc=$?\"; \
         echo \"zero $(head -c 3 /dev/zero | wc -c)\"; \
         echo \"urandom $(head -c 4 /dev/urandom | wc -c)\"; \
         mknod {d}/blk b 7 1 2>&1; echo \"mknod-blk rc=$?\"; \
         mknod {d}/null c 1 3 2>&1; echo \"mknod-null rc=$?\"; \
         head -c 1 {d}/tun >/dev/null 2>{d}/tun.err; echo \"tun rc=$? $(cat {d}/tun.err)\"; \
         head -c 1 {d}/loop >/dev/null 2>{d}/loop.err; echo \"loop rc=$? $(cat {d}/loop.err)\"",
        d = s.display()
    );
    let run = |inside: bool| {
        let (child, stdin) = gated_to(&script, Stdio::piped());
        if inside {
            enter(&cg, &child);
        }
        release(stdin);
        let out = child.wait_with_output().unwrap();
        for f in ["blk", "null", "tun.err", "loop.err"] {
            let _ = std::fs::remove_file(s.join(f));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let inside = run(true);
    println!("inside the sandbox's v2 cgroup:\n{inside}");
    let has = |out: &str, line: &str| out.lines().any(|l| l.starts_with(line));
    for ok in ["null rc=0", "zero 3", "urandom 4", "mknod-null rc=0"] {
        assert!(has(&inside, ok), "{ok:?} missing:\n{inside}");
    }
    assert!(
        inside.contains("Operation not permitted\nmknod-blk rc=1"),
        "mknod of a block device:\n{inside}"
    );
    for node in ["tun", "loop"] {
        let line = inside
            .lines()
            .find(|l| l.starts_with(&format!("{node} rc=")))
            .unwrap_or_default();
        assert!(
            line.starts_with(&format!("{node} rc=1")) && line.contains("Operation not permitted"),
            "opening {node}: {line:?}"
        );
    }
    // The same root shell outside the cgroup: the refusals were the
    // program's, not a missing capability's or a mount option's.
    let outside = run(false);
    println!("outside:\n{outside}");
    assert!(has(&outside, "mknod-blk rc=0"), "{outside}");
    for node in ["tun", "loop"] {
        let line = outside
            .lines()
            .find(|l| l.starts_with(&format!("{node} rc=")))
            .unwrap_or_default();
        assert!(!line.contains("Operation not permitted"), "{line:?}");
    }

    cg.kill_all().unwrap();
    cg.remove().unwrap();
    assert!(!dir.exists());
}

/// What the kernel says of `cg`'s freezer, read from its own file (not
/// through the code under test): v1 `freezer.state` is `FROZEN`, v2
/// `cgroup.events` has `frozen 1`.
fn kernel_frozen(dir: &Path, layout: Layout) -> bool {
    if layout == Layout::V2 {
        let events = std::fs::read_to_string(dir.join("cgroup.events")).unwrap();
        return events.lines().any(|l| l == "frozen 1");
    }
    std::fs::read_to_string(dir.join("freezer.state"))
        .unwrap()
        .trim()
        == "FROZEN"
}

/// Freeze, thaw and a kill while frozen of a real process in `cg` (whose
/// freezer directory is `dir`): the kernel reports the cgroup frozen, a
/// line written to the process while frozen is answered once thawed (the
/// same process, its state intact), and `kill_all` of a frozen cgroup
/// kills it without a thaw first (v1 thaws after the signal; v2
/// `cgroup.kill` reaches frozen tasks).
fn freeze_thaw_kill(cg: &SandboxCgroup, dir: &Path, layout: Layout) {
    use std::io::{BufRead, BufReader};
    // A failed assertion leaves no frozen process behind (holding the
    // test's output pipe open).
    struct Thaw<'a>(&'a SandboxCgroup);
    impl Drop for Thaw<'_> {
        fn drop(&mut self) {
            let _ = self.0.thaw();
            let _ = self.0.kill_all();
        }
    }
    let _thaw = Thaw(cg);
    let mut echo = Command::new("/bin/sh")
        .arg("-c")
        .arg("n=0; while read l; do n=$((n+1)); echo \"$n $l\"; done")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    enter(cg, &echo);
    let mut stdin = echo.stdin.take().unwrap();
    let mut out = BufReader::new(echo.stdout.take().unwrap());
    let ask = |stdin: &mut ChildStdin, what: &str| {
        stdin.write_all(format!("{what}\n").as_bytes()).unwrap();
    };
    let mut answer = || {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l
    };
    ask(&mut stdin, "before");
    assert_eq!(answer(), "1 before\n");

    assert!(!cg.is_frozen().unwrap());
    cg.freeze().unwrap();
    assert!(kernel_frozen(dir, layout), "the kernel does not say frozen");
    assert!(cg.is_frozen().unwrap());
    // Written while frozen, answered after the thaw by the same process
    // (its count goes on).
    ask(&mut stdin, "while-frozen");
    let start = Instant::now();
    cg.thaw().unwrap();
    println!("{layout:?} thaw took {:?}", start.elapsed());
    assert!(!kernel_frozen(dir, layout), "still frozen after the thaw");
    assert!(!cg.is_frozen().unwrap());
    assert_eq!(answer(), "2 while-frozen\n");

    // Killed while frozen: no thaw needed first.
    cg.freeze().unwrap();
    assert!(kernel_frozen(dir, layout));
    cg.kill_all().unwrap();
    let st = echo.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    assert!(cg.pids().unwrap().is_empty());
}

/// The freezer of the host's layout (v1 `freezer.state` on a hybrid
/// host, v2 `cgroup.freeze` on a pure v2 one) on a real process.
#[test]
fn freeze_thaw_and_kill_while_frozen() {
    let Some(t) = TestRoot::new() else { return };
    let sid = id("frz");
    let cg = t.root.create(&sid, &LIMITS).unwrap();
    let layout = t.root.layout();
    let dir = match layout {
        Layout::V2 => Path::new("/sys/fs/cgroup").join(&t.parent).join(&sid),
        _ => Path::new("/sys/fs/cgroup/freezer")
            .join(&t.parent)
            .join(&sid),
    };
    freeze_thaw_kill(&cg, &dir, layout);
    cg.remove().unwrap();
}

/// The v2 freezer (`cgroup.freeze`, `cgroup.events`) and `cgroup.kill` of
/// a frozen cgroup on a real kernel, also on a hybrid host: they are core
/// v2 files, present in the unified hierarchy without any controller.
/// (`memory.reclaim` needs the memory controller: fake-tree unit tests in
/// `sandbox-cgroups`.)
#[test]
fn v2_freeze_thaw_and_kill_while_frozen_on_the_unified_hierarchy() {
    let Some(t) = TestRoot::new() else { return };
    let (root, dir) = match t.root.layout() {
        Layout::V2 => (None, Path::new("/sys/fs/cgroup").to_path_buf()),
        Layout::Hybrid => {
            let unified = Path::new("/sys/fs/cgroup/unified");
            let v2 = CgroupRoot::with_root(unified, Layout::V2, &t.parent);
            (Some(v2), unified.to_path_buf())
        }
        Layout::V1 => {
            println!("SKIP: no cgroup v2 hierarchy on this host");
            return;
        }
    };
    let root = root.as_ref().unwrap_or(&t.root);
    let _rm = Rm(dir.join(&t.parent));
    let sid = id("v2frz");
    let cg = root.create(&sid, &NO_LIMITS).unwrap();
    let cgdir = dir.join(&t.parent).join(&sid);
    assert!(
        cgdir.join("cgroup.freeze").exists(),
        "kernel without cgroup.freeze"
    );
    freeze_thaw_kill(&cg, &cgdir, Layout::V2);
    cg.remove().unwrap();
    assert!(!cgdir.exists());
}
