//! `sandbox-init`: the single-threaded launcher the daemon execs for every
//! sandbox. It reads the bundle's `config.json` (the only description of
//! the container), builds the sandbox in the order given in
//! `docs/architecture.md`, and execs the payload (the agent) as PID 1 of a
//! new PID namespace. It reports the container's host PID, or the step that
//! failed, to the daemon over a CLOEXEC pipe ([`report`]).
//!
//! The daemon never forks: it execs this binary, which is single-threaded,
//! so `fork` here is safe.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use nix::unistd::ForkResult;
pub mod mounts;
pub mod process;
pub mod spec;
pub mod sys;
pub mod userns;

use spec::{LinuxNamespaceType, Spec};
use sys::Sys;

use sandbox_abi::failpoint::Point;
use sandbox_abi::handoff::{
    Report, Reporter, BUNDLE_ARG, READY_FD_ARG, READY_FD_ENV, REPORT_FD_ARG, SECCOMP_BPF_ARG,
};

/// A failed step; the variant names the step reported to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot load {path}: {message}")]
    LoadSpec { path: PathBuf, message: String },
    #[error("spec: {0}")]
    Spec(String),
    #[error("{0}")]
    Seccomp(String),
    #[error("{0}")]
    JoinCgroup(String),
    #[error("unshare: {0}")]
    Unshare(nix::Error),
    #[error("{0}")]
    Userns(String),
    #[error("fork: {0}")]
    Fork(nix::Error),
    #[error("make / private: {0}")]
    MakePrivate(nix::Error),
    #[error("{step} {path}: {message}")]
    Mount {
        step: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("sethostname: {0}")]
    Hostname(nix::Error),
    #[error("{0}")]
    Loopback(String),
    #[error("{0}")]
    Rlimit(String),
    #[error("{0}")]
    OomScoreAdj(String),
    #[error("{0}")]
    CloseFds(String),
    #[error("{0}")]
    SwitchUser(String),
    #[error("{0}")]
    DropCaps(String),
    #[error("no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    #[error("chdir {path}: {}", chdir_reason(*.source))]
    Chdir {
        path: PathBuf,
        source: rustix::io::Errno,
    },
    #[error("exec {path}: {source}")]
    Exec { path: String, source: nix::Error },
}

impl InitError {
    /// The step name reported to the daemon.
    pub fn step(&self) -> &'static str {
        match self {
            InitError::LoadSpec { .. } | InitError::Spec(_) => "load_spec",
            InitError::Seccomp(_) => "seccomp",
            InitError::JoinCgroup(_) => "join_cgroup",
            InitError::Unshare(_) => "unshare",
            InitError::Userns(_) => "userns",
            InitError::Fork(_) => "fork",
            InitError::MakePrivate(_) => "make_private",
            InitError::Mount { .. } => "mount",
            InitError::Hostname(_) => "hostname",
            InitError::Loopback(_) => "loopback",
            InitError::Rlimit(_) => "rlimits",
            InitError::OomScoreAdj(_) => "oom_score_adj",
            InitError::CloseFds(_) => "close_fds",
            InitError::SwitchUser(_) => "switch_user",
            InitError::DropCaps(_) => "drop_caps",
            InitError::NoNewPrivs(_) => "no_new_privs",
            InitError::Chdir { .. } => "chdir",
            InitError::Exec { .. } => "exec",
        }
    }
}

/// Command-line arguments of `sandbox-init`.
#[derive(Debug, Clone)]
pub struct Args {
    pub bundle: PathBuf,
    pub report_fd: Option<RawFd>,
    pub ready_fd: Option<RawFd>,
    /// `--seccomp-bpf PATH`: the compiled filters to install (the
    /// daemon's, compiled once at its start) instead of compiling the
    /// bundle's `linux.seccomp`.
    pub seccomp_bpf: Option<PathBuf>,
    /// `--probe-idmap PATH` (repeatable) with `--probe-base N`: check that
    /// idmapped mounts work for these paths and exit (the daemon's
    /// start-up probe), instead of launching a bundle.
    pub probe_idmap: Vec<PathBuf>,
    pub probe_base: u32,
}

/// `--probe-idmap`: a path to check idmapped mounts on.
pub const PROBE_IDMAP_ARG: &str = "--probe-idmap";
/// `--probe-base`: the first host id of the probe's user namespace.
pub const PROBE_BASE_ARG: &str = "--probe-base";

impl Args {
    pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut bundle = None;
        let mut report_fd = None;
        let mut ready_fd = None;
        let mut seccomp_bpf = None;
        let mut probe_idmap = Vec::new();
        let mut probe_base = 1u32 << 31;
        while let Some(a) = it.next() {
            let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
            match a.as_str() {
                BUNDLE_ARG => bundle = Some(PathBuf::from(val(BUNDLE_ARG)?)),
                REPORT_FD_ARG => {
                    report_fd = Some(val(REPORT_FD_ARG)?.parse().map_err(|_| "bad --report-fd")?)
                }
                READY_FD_ARG => {
                    ready_fd = Some(val(READY_FD_ARG)?.parse().map_err(|_| "bad --ready-fd")?)
                }
                SECCOMP_BPF_ARG => seccomp_bpf = Some(PathBuf::from(val(SECCOMP_BPF_ARG)?)),
                PROBE_IDMAP_ARG => probe_idmap.push(PathBuf::from(val(PROBE_IDMAP_ARG)?)),
                PROBE_BASE_ARG => {
                    probe_base = val(PROBE_BASE_ARG)?
                        .parse()
                        .map_err(|_| "bad --probe-base")?
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if !probe_idmap.is_empty() {
            return Ok(Args {
                bundle: PathBuf::new(),
                report_fd,
                ready_fd,
                seccomp_bpf,
                probe_idmap,
                probe_base,
            });
        }
        Ok(Args {
            bundle: bundle.ok_or("--bundle DIR is required")?,
            report_fd,
            ready_fd,
            seccomp_bpf,
            probe_idmap,
            probe_base,
        })
    }
}

/// Entry point of the binary; returns the exit code on failure (success
/// never returns: the process becomes the payload).
pub fn main_with(args: Args) -> i32 {
    if !args.probe_idmap.is_empty() {
        return match userns::probe(&args.probe_idmap, args.probe_base) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{e}");
                1
            }
        };
    }
    let reporter = match args.report_fd {
        // SAFETY: the daemon hands us this fd and nothing else in this
        // process owns it.
        Some(fd) => unsafe { Reporter::from_raw(fd) },
        None => Reporter::none(),
    };
    match launch(&mut sys::Host, &args, &reporter) {
        // The launcher's parent: the child's PID is reported.
        Ok(Launched::Parent) => 0,
        Err(e) => {
            reporter.send(&Report::Failed {
                step: e.step().to_string(),
                error: e.to_string(),
            });
            1
        }
    }
}

fn ns_flag(t: LinuxNamespaceType) -> Result<CloneFlags, InitError> {
    Ok(match t {
        LinuxNamespaceType::Mount => CloneFlags::CLONE_NEWNS,
        LinuxNamespaceType::Pid => CloneFlags::CLONE_NEWPID,
        LinuxNamespaceType::Network => CloneFlags::CLONE_NEWNET,
        LinuxNamespaceType::Ipc => CloneFlags::CLONE_NEWIPC,
        LinuxNamespaceType::Uts => CloneFlags::CLONE_NEWUTS,
        LinuxNamespaceType::Cgroup => CloneFlags::CLONE_NEWCGROUP,
        LinuxNamespaceType::User => CloneFlags::CLONE_NEWUSER,
        other => {
            return Err(InitError::Spec(format!(
                "namespace {other:?} is not supported by sandbox-init"
            )))
        }
    })
}

fn cstring(s: &str) -> Result<CString, InitError> {
    CString::new(s).map_err(|_| InitError::Spec(format!("{s:?} contains a NUL byte")))
}

/// How [`launch`] returns when it does not fail: in the parent, once the
/// child's PID is reported (the child returns only on failure: it
/// becomes the payload).
#[derive(Debug, PartialEq, Eq)]
pub enum Launched {
    Parent,
}

/// The launch sequence, top to bottom. Each step says why it is where it
/// is; every privileged call goes through `sys` ([`sys::Host`] in the
/// binary, a recording fake in the tests).
pub fn launch<S: Sys>(
    sys: &mut S,
    args: &Args,
    reporter: &Reporter,
) -> Result<Launched, InitError> {
    // 1. Load the spec: the bundle's config.json is the only description of
    //    the container. Everything that can fail for a bad spec fails here,
    //    before anything is created.
    let cfg = args.bundle.join("config.json");
    // Read whole, then parsed from the slice (`Spec::load` parses from a
    // reader, byte by byte: several times slower on the 110 KiB with the
    // seccomp profile).
    let spec: Spec = sys
        .read_config(&cfg)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
        .map_err(|message| InitError::LoadSpec {
            path: cfg.clone(),
            message,
        })?;
    let process = spec
        .process()
        .clone()
        .ok_or_else(|| InitError::Spec("no process".into()))?;
    let linux = spec
        .linux()
        .clone()
        .ok_or_else(|| InitError::Spec("no linux section".into()))?;
    let root = spec
        .root()
        .clone()
        .ok_or_else(|| InitError::Spec("no root".into()))?;
    let rootfs = if root.path().is_absolute() {
        root.path().clone()
    } else {
        args.bundle.join(root.path())
    };
    let skeleton = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION))
        .map(|v| serde_json::from_str::<sandbox_abi::handoff::RootSkeleton>(v))
        .transpose()
        .map_err(|e| {
            InitError::Spec(format!(
                "annotation {}: {e}",
                sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION
            ))
        })?;
    let caps_wanted = process.capabilities().as_ref().is_some_and(|c| c.any());
    if caps_wanted {
        return Err(InitError::Spec(
            "sandbox-init grants no capabilities; the spec lists some".into(),
        ));
    }
    let argv: Vec<CString> = process
        .args()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<_, _>>()?;
    if argv.is_empty() {
        return Err(InitError::Spec("process.args is empty".into()));
    }
    // 2. Scrub the environment: the payload gets exactly the spec's env
    //    (plus the ready fd), never anything inherited from the daemon.
    let mut envp: Vec<CString> = process
        .env()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|e| cstring(e))
        .collect::<Result<_, _>>()?;
    if let Some(fd) = args.ready_fd {
        envp.push(cstring(&format!("{READY_FD_ENV}={fd}"))?);
    }
    // 3. Load the seccomp filters now, while allocation is cheap and a
    //    bad profile can still fail before anything exists: the stack the
    //    daemon compiled at start (`--seccomp-bpf`), else the bundle's
    //    `linux.seccomp` compiled here (a bundle run by hand; only with
    //    the feature `compile`, else such a bundle is refused). They are
    //    installed last, right before exec.
    let filters = sys.load_seccomp(args.seccomp_bpf.as_deref(), &cfg, spec.has_seccomp())?;
    // Test-only crash injection (a no-op in release builds).
    let mut failpoints = sandbox_abi::failpoint::InitPoints::from_env();

    // 4. Join the sandbox's cgroup before any namespace or payload exists,
    //    so every process of the sandbox is accounted and limited from its
    //    first instruction (children inherit the cgroup).
    if let Some(path) = linux.cgroups_path() {
        sys.join_cgroup(path)?;
    }
    let all_mounts = spec.mounts().clone().unwrap_or_default();
    // 4p. A warm-pool member's attach points, copied while still in the
    //     daemon's mount namespace (see mounts::SlaveTrees).
    let mut slaves = sys.open_slaves(&all_mounts)?;

    // 5. New namespaces. The cgroup namespace comes after joining, so the
    //    sandbox sees its own cgroup as the root. A new PID namespace only
    //    applies to children, hence the fork below.
    let mut flags = CloneFlags::empty();
    for ns in linux.namespaces().clone().unwrap_or_default() {
        if ns.path().is_some() {
            return Err(InitError::Spec(
                "joining existing namespaces is not supported".into(),
            ));
        }
        flags |= ns_flag(ns.typ())?;
    }
    let with_userns = flags.contains(CloneFlags::CLONE_NEWUSER);
    if with_userns {
        // 5u. With a user namespace (see userns.rs and
        //     docs/security.md#user-namespaces): create it; in a mount
        //     namespace of our own, still as host root, build the
        //     sandbox's tree with every bind idmapped through it (idmapping
        //     needs host privileges) and every mount that must belong to
        //     the sandbox's own namespaces left for PID 1; set what needs
        //     host privileges (rlimits, OOM score); then join the user
        //     namespace and create the other namespaces from inside it,
        //     so its root owns them. The copy of the mount tree into a
        //     namespace owned by the sandbox locks every mount in it: its
        //     root can neither unmount one nor make a read-only one
        //     writable.
        let uid = id_maps(linux.uid_mappings().as_deref())?;
        let gid = id_maps(linux.gid_mappings().as_deref())?;
        let owner = userns::to_host(&uid, 0)
            .ok_or_else(|| InitError::Spec("linux.uidMappings does not map uid 0".into()))?;
        let (ns, holder) = sys.create_userns(&uid, &gid, owner)?;
        failpoints.keep_a_killer();
        sys.unshare(CloneFlags::CLONE_NEWNS)?;
        sys.make_private()?;
        if let Some(sk) = &skeleton {
            sys.root_tmpfs(&rootfs, sk)?;
        }
        let idmap = mounts::Idmap {
            userns: std::os::fd::AsFd::as_fd(&ns),
            uid: &uid,
            gid: &gid,
        };
        sys.bind_rootfs(&rootfs)?;
        for m in &all_mounts {
            if mounts::is_deferred(m) {
                sys.make_mount_point(&mounts::beneath(&rootfs, m.destination()))?;
            } else {
                sys.mount(&rootfs, m, Some(&mut slaves), Some(&idmap))?;
            }
        }
        sys.create_devices(
            &rootfs,
            &linux.devices().clone().unwrap_or_default(),
            Some(&uid),
            Some(&gid),
        )?;
        // The root read-only now, so that the copy below locks it so.
        if root.readonly() == Some(true) {
            sys.remount_readonly(&rootfs)?;
        }
        // PID 1 works from here (the sandbox's root may not search the
        // daemon's state directory); the next unshare carries the
        // current directory into the new mount namespace.
        sys.chdir(&rootfs)?;
        sys.set_rlimits(&process.rlimits().clone().unwrap_or_default())?;
        if let Some(score) = process.oom_score_adj() {
            sys.set_oom_score_adj(score)?;
        }
        sys.enter_userns(ns)?;
        sys.unshare(flags - CloneFlags::CLONE_NEWUSER)?;
        // Exited long ago: reap it before the fork.
        drop(holder);
    } else {
        sys.unshare(flags)?;
    }
    failpoints.hit(Point::InitAfterNamespaces);

    // 6. Fork: the child is PID 1 of the new PID namespace. The parent
    //    reports the child's host PID and exits; the child is re-parented
    //    to the daemon (a subreaper) or the host's init.
    match sys.fork()? {
        ForkResult::Parent { child } => {
            failpoints.before_pid_report();
            reporter.send(&Report::Pid {
                pid: child.as_raw(),
            });
            failpoints.after_pid_report();
            return Ok(Launched::Parent);
        }
        ForkResult::Child => failpoints.after_fork_child(),
    }

    if with_userns {
        // 8u. The mounts left for the sandbox's own namespaces, relative
        //     to the rootfs (the current directory), then a fresh,
        //     unlocked copy of the rootfs for pivot_root.
        for m in &all_mounts {
            if mounts::is_deferred(m) {
                sys.mount(Path::new("."), m, None, None)?;
            }
        }
        failpoints.hit(Point::InitAfterMounts);
        sys.reattach_cwd(&rootfs)?;
        sys.pivot(Path::new("."))?;
    } else {
        // 7. Make every mount private before touching anything, so no
        //    mount made below propagates to the host.
        sys.make_private()?;
        if let Some(sk) = &skeleton {
            sys.root_tmpfs(&rootfs, sk)?;
        }

        // 8. The rootfs and the mount table, in the spec's order (tmpfs
        //    homes before the binds inside them). Bind sources are opened
        //    without following any symlink and mounted from the fd.
        sys.bind_rootfs(&rootfs)?;
        for m in &all_mounts {
            sys.mount(&rootfs, m, Some(&mut slaves), None)?;
        }
        sys.create_devices(
            &rootfs,
            &linux.devices().clone().unwrap_or_default(),
            None,
            None,
        )?;
        failpoints.hit(Point::InitAfterMounts);

        // 9. pivot_root into the rootfs and detach the host's root: from
        //    here on no host path is reachable.
        sys.pivot(&rootfs)?;
    }

    // 10. Masked and read-only paths (inside the new root, over the new
    //     /proc and /sys), then the root itself read-only.
    for p in linux.masked_paths().clone().unwrap_or_default() {
        sys.mask(Path::new(&p))?;
    }
    for p in linux.readonly_paths().clone().unwrap_or_default() {
        sys.make_readonly(Path::new(&p))?;
    }
    if root.readonly() == Some(true) {
        sys.readonly_root()?;
    }

    // 11. Hostname (new UTS namespace) and loopback (new network
    //     namespace: the agent listens on 127.0.0.1 there).
    if let Some(h) = spec.hostname() {
        sys.sethostname(h)?;
    }
    if flags.contains(CloneFlags::CLONE_NEWNET) {
        sys.loopback_up()?;
    }

    // 12. Resource limits and umask, inherited by everything the payload
    //     starts.
    //     (With a user namespace, set at step 5u: raising a hard limit
    //     needs host privileges.)
    if !with_userns {
        sys.set_rlimits(&process.rlimits().clone().unwrap_or_default())?;
    }
    sys.umask(process.user().umask().unwrap_or(0o077));

    // 13. The OOM score (OCI `process.oomScoreAdj`, when a base spec sets
    //     one; the shipped one does not, see docs/operations.md): when the sandbox hits its memory limit, the kernel's OOM
    //     killer must pick the hog, not PID 1 (the agent; killing it ends
    //     the whole sandbox). Lowering the score needs CAP_SYS_RESOURCE,
    //     so this runs before privileges are dropped, and it runs after the
    //     fork so only the container's processes carry it. The agent puts
    //     every command it starts back to 0.
    if let Some(score) = process.oom_score_adj().filter(|_| !with_userns) {
        sys.set_oom_score_adj(score)?;
    }

    // 14. Close every fd but stdio and the ready pipe at exec.
    sys.close_other_fds(args.ready_fd)?;

    // 15. Drop privileges: the capability sets setuid does not clear
    //     (needs CAP_SETPCAP, so still as root), then groups, gid, uid;
    //     then verify that every set is empty.
    sys.drop_inheritable_caps()?;
    //     (In a user namespace setgroups is denied: the host's
    //     supplementary groups were dropped before the join.)
    sys.switch_user(process.user(), !with_userns)?;
    sys.verify_no_caps()?;

    // 16. The working directory, entered as the sandbox user and resolved
    //     inside the new root without following any symlink (openat2
    //     RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS, then fchdir): the workdir
    //     lies in a tree the sandbox's users can write, so one swapped for a
    //     symlink after the daemon checked it fails here, never followed.
    sys.enter_workdir(process.cwd())?;

    // 17. no_new_privs: required for an unprivileged seccomp filter and
    //     makes setuid binaries inert.
    sys.no_new_privs()?;

    // 18. seccomp, the very last step: from here on only exec runs.
    if let Some(f) = &filters {
        sys.install_seccomp(f)?;
    }

    // 19. exec the payload.
    Err(sys.exec(&argv[0], &argv, &envp))
}

/// The spec's `linux.uidMappings`/`gidMappings`.
fn id_maps(maps: Option<&[spec::LinuxIdMapping]>) -> Result<Vec<userns::IdMap>, InitError> {
    let maps: Vec<userns::IdMap> = maps
        .unwrap_or_default()
        .iter()
        .map(|m| userns::IdMap {
            container: m.container_id(),
            host: m.host_id(),
            size: m.size(),
        })
        .collect();
    if maps.is_empty() {
        return Err(InitError::Spec(
            "a user namespace needs linux.uidMappings and linux.gidMappings".into(),
        ));
    }
    Ok(maps)
}

/// `chdir` to `cwd` without following a symlink in any component.
pub(crate) fn enter_workdir(cwd: &Path) -> Result<(), InitError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let err = |source| InitError::Chdir {
        path: cwd.to_path_buf(),
        source,
    };
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = rustix::fs::open("/", flags, Mode::empty()).map_err(err)?;
    let dir = rustix::fs::openat2(
        &root,
        cwd,
        flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(err)?;
    rustix::process::fchdir(&dir).map_err(err)
}

/// The reason a working directory could not be entered, in plain words.
fn chdir_reason(e: rustix::io::Errno) -> String {
    match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => {
            "is or passes through a symlink".to_string()
        }
        rustix::io::Errno::NOENT => "does not exist".to_string(),
        rustix::io::Errno::NOTDIR => "is not a directory".to_string(),
        other => other.to_string(),
    }
}

/// Reads the filter stack the daemon compiled (see `--seccomp-bpf`).
pub(crate) fn load_seccomp_bpf(path: &Path) -> Result<Vec<sandbox_abi::bpf::Program>, InitError> {
    sandbox_abi::bpf::read(path).map_err(|e| InitError::Seccomp(e.to_string()))
}

/// Compiles the `linux.seccomp` section of `config.json` exactly as
/// written there (the profile in OCI format, with its comments): a bundle
/// run by hand (feature `compile`).
#[cfg(feature = "compile")]
pub(crate) fn compile_seccomp(
    cfg: &Path,
    _present: bool,
) -> Result<Option<Vec<sandbox_abi::bpf::Program>>, InitError> {
    let text = std::fs::read_to_string(cfg).map_err(|e| InitError::LoadSpec {
        path: cfg.to_path_buf(),
        message: e.to_string(),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| InitError::LoadSpec {
        path: cfg.to_path_buf(),
        message: e.to_string(),
    })?;
    let Some(section) = v.get("linux").and_then(|l| l.get("seccomp")) else {
        return Ok(None);
    };
    let origin = format!("{} (linux.seccomp)", cfg.display());
    let profile = sandbox_seccomp::Profile::parse(&section.to_string(), &origin)
        .map_err(|e| InitError::Seccomp(e.to_string()))?;
    let compiled =
        sandbox_seccomp::compile(&profile).map_err(|e| InitError::Seccomp(e.to_string()))?;
    Ok(Some(sandbox_seccomp::wire::programs(&compiled)))
}

/// Without the `compile` feature (the launcher the daemon ships) a bundle
/// with a profile needs its compiled stack handed over: it is refused
/// rather than run without its filter.
#[cfg(not(feature = "compile"))]
pub(crate) fn compile_seccomp(
    cfg: &Path,
    present: bool,
) -> Result<Option<Vec<sandbox_abi::bpf::Program>>, InitError> {
    if present {
        return Err(InitError::Seccomp(format!(
            "{} has a seccomp profile (linux.seccomp) and no compiled filter stack was \
             handed over ({SECCOMP_BPF_ARG}); this sandbox-init is built without the \
             `compile` feature that would compile it",
            cfg.display()
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod launch_tests;
