//! The seam between the launch sequence and the kernel: every privileged
//! call [`launch`](crate) makes goes through [`Sys`], one method per call,
//! so the order of the steps (the table in `docs/architecture.md`, "The
//! launch sequence") and what a failure at each step stops can be tested
//! without root, by a fake that records the calls. [`Host`] is the real
//! implementation, the one the binary uses: each method is the call the
//! launcher made before the seam existed (monomorphized, no indirection).

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;

use nix::sched::CloneFlags;
use nix::unistd::ForkResult;

use crate::mounts::{self, Idmap, SlaveTrees};
use crate::spec::{LinuxDevice, Mount, PosixRlimit, User};
use crate::userns::{self, IdMap};
use crate::InitError;
use sandbox_abi::bpf::Program;
use sandbox_abi::handoff::RootSkeleton;

/// The privileged calls of the launch sequence, in the order they are
/// made (see `docs/architecture.md`).
pub trait Sys {
    /// The copies of a warm-pool member's attach points ([`SlaveTrees`]).
    type Slaves;
    /// What keeps a user namespace's holder child until it is reaped (on
    /// drop).
    type Holder;

    /// Step 1: the bundle's `config.json`.
    fn read_config(&mut self, path: &Path) -> std::io::Result<Vec<u8>>;
    /// Step 3: the compiled stack handed over (`bpf`), else the bundle's
    /// `linux.seccomp` (`present`) compiled with the `compile` feature.
    fn load_seccomp(
        &mut self,
        bpf: Option<&Path>,
        cfg: &Path,
        present: bool,
    ) -> Result<Option<Vec<Program>>, InitError>;
    /// Step 4.
    fn join_cgroup(&mut self, cgroups_path: &Path) -> Result<(), InitError>;
    /// Step 4p: a warm-pool member's attach points, copied in the daemon's
    /// mount namespace.
    fn open_slaves(&mut self, mounts: &[Mount]) -> Result<Self::Slaves, InitError>;
    /// Step 5u.1.
    fn create_userns(
        &mut self,
        uid: &[IdMap],
        gid: &[IdMap],
        owner: u32,
    ) -> Result<(OwnedFd, Self::Holder), InitError>;
    /// Step 5 (5u.2: the mount namespace alone, 5u.4: the rest).
    fn unshare(&mut self, flags: CloneFlags) -> Result<(), InitError>;
    /// Step 7 (5u.2).
    fn make_private(&mut self) -> Result<(), InitError>;
    /// The root skeleton's tmpfs over the empty `rootfs/`.
    fn root_tmpfs(&mut self, rootfs: &Path, skeleton: &RootSkeleton) -> Result<(), InitError>;
    /// Step 8: the rootfs bound onto itself.
    fn bind_rootfs(&mut self, rootfs: &Path) -> Result<(), InitError>;
    /// Step 8: one entry of the mount table beneath `rootfs` (a slave
    /// bind from `slaves`, else made here, idmapped with `idmap`).
    fn mount(
        &mut self,
        rootfs: &Path,
        m: &Mount,
        slaves: Option<&mut Self::Slaves>,
        idmap: Option<&Idmap<'_>>,
    ) -> Result<(), InitError>;
    /// Step 5u.2: a mount point left for PID 1.
    fn make_mount_point(&mut self, target: &Path) -> Result<(), InitError>;
    /// Step 8: device nodes and `/dev` links.
    fn create_devices(
        &mut self,
        rootfs: &Path,
        devices: &[LinuxDevice],
        uid: Option<&[IdMap]>,
        gid: Option<&[IdMap]>,
    ) -> Result<(), InitError>;
    /// Step 5u.2: the rootfs read-only before the copy locks it.
    fn remount_readonly(&mut self, rootfs: &Path) -> Result<(), InitError>;
    /// Step 5u.2: PID 1 works from the rootfs.
    fn chdir(&mut self, dir: &Path) -> Result<(), InitError>;
    /// Step 12 (5u.3).
    fn set_rlimits(&mut self, limits: &[PosixRlimit]) -> Result<(), InitError>;
    /// Step 13 (5u.3).
    fn set_oom_score_adj(&mut self, score: i32) -> Result<(), InitError>;
    /// Step 5u.4: join the user namespace as its root; the fd is closed
    /// and the holder reaped afterwards.
    fn enter_userns(&mut self, ns: OwnedFd) -> Result<(), InitError>;
    /// Step 6.
    fn fork(&mut self) -> Result<ForkResult, InitError>;
    /// Step 8u: a fresh copy of the rootfs on top of itself.
    fn reattach_cwd(&mut self, rootfs: &Path) -> Result<(), InitError>;
    /// Step 9.
    fn pivot(&mut self, new_root: &Path) -> Result<(), InitError>;
    /// Step 10.
    fn mask(&mut self, path: &Path) -> Result<(), InitError>;
    fn make_readonly(&mut self, path: &Path) -> Result<(), InitError>;
    fn readonly_root(&mut self) -> Result<(), InitError>;
    /// Step 11.
    fn sethostname(&mut self, name: &str) -> Result<(), InitError>;
    fn loopback_up(&mut self) -> Result<(), InitError>;
    /// Step 12.
    fn umask(&mut self, mask: u32);
    /// Step 14.
    fn close_other_fds(&mut self, keep: Option<RawFd>) -> Result<(), InitError>;
    /// Step 15.
    fn drop_inheritable_caps(&mut self) -> Result<(), InitError>;
    fn switch_user(&mut self, user: &User, may_setgroups: bool) -> Result<(), InitError>;
    fn verify_no_caps(&mut self) -> Result<(), InitError>;
    /// Step 16.
    fn enter_workdir(&mut self, cwd: &Path) -> Result<(), InitError>;
    /// Step 17.
    fn no_new_privs(&mut self) -> Result<(), InitError>;
    /// Step 18.
    fn install_seccomp(&mut self, filters: &[Program]) -> Result<(), InitError>;
    /// Step 19: returns only on failure.
    fn exec(&mut self, path: &CString, argv: &[CString], envp: &[CString]) -> InitError;
}

/// The kernel: what the `sandbox-init` binary runs.
pub struct Host;

impl Sys for Host {
    type Slaves = SlaveTrees;
    type Holder = userns::Holder;

    fn read_config(&mut self, path: &Path) -> std::io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn load_seccomp(
        &mut self,
        bpf: Option<&Path>,
        cfg: &Path,
        present: bool,
    ) -> Result<Option<Vec<Program>>, InitError> {
        match bpf {
            Some(path) => crate::load_seccomp_bpf(path).map(Some),
            None => crate::compile_seccomp(cfg, present),
        }
    }
    fn join_cgroup(&mut self, cgroups_path: &Path) -> Result<(), InitError> {
        sandbox_abi::cgroupfs::join_host(cgroups_path, std::process::id())
            .map_err(|m| InitError::JoinCgroup(format!("{}: {m}", cgroups_path.display())))
    }
    fn open_slaves(&mut self, mounts: &[Mount]) -> Result<SlaveTrees, InitError> {
        SlaveTrees::open(mounts)
    }
    fn create_userns(
        &mut self,
        uid: &[IdMap],
        gid: &[IdMap],
        owner: u32,
    ) -> Result<(OwnedFd, userns::Holder), InitError> {
        userns::create(uid, gid, owner).map_err(InitError::Userns)
    }
    fn unshare(&mut self, flags: CloneFlags) -> Result<(), InitError> {
        nix::sched::unshare(flags).map_err(InitError::Unshare)
    }
    fn make_private(&mut self) -> Result<(), InitError> {
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(InitError::MakePrivate)
    }
    fn root_tmpfs(&mut self, rootfs: &Path, skeleton: &RootSkeleton) -> Result<(), InitError> {
        mounts::root_tmpfs(rootfs, skeleton)
    }
    fn bind_rootfs(&mut self, rootfs: &Path) -> Result<(), InitError> {
        mounts::bind_rootfs(rootfs)
    }
    fn mount(
        &mut self,
        rootfs: &Path,
        m: &Mount,
        slaves: Option<&mut SlaveTrees>,
        idmap: Option<&Idmap<'_>>,
    ) -> Result<(), InitError> {
        if let Some(s) = slaves {
            if s.apply(rootfs, m)? {
                return Ok(());
            }
        }
        mounts::apply(rootfs, m, idmap)
    }
    fn make_mount_point(&mut self, target: &Path) -> Result<(), InitError> {
        mounts::make_mount_point(target, false)
    }
    fn create_devices(
        &mut self,
        rootfs: &Path,
        devices: &[LinuxDevice],
        uid: Option<&[IdMap]>,
        gid: Option<&[IdMap]>,
    ) -> Result<(), InitError> {
        mounts::create_devices(rootfs, devices, uid, gid)
    }
    fn remount_readonly(&mut self, rootfs: &Path) -> Result<(), InitError> {
        mounts::remount_readonly(rootfs)
    }
    fn chdir(&mut self, dir: &Path) -> Result<(), InitError> {
        nix::unistd::chdir(dir).map_err(|e| InitError::Mount {
            step: "chdir rootfs",
            path: dir.to_path_buf(),
            message: e.to_string(),
        })
    }
    fn set_rlimits(&mut self, limits: &[PosixRlimit]) -> Result<(), InitError> {
        crate::process::set_rlimits(limits)
    }
    fn set_oom_score_adj(&mut self, score: i32) -> Result<(), InitError> {
        crate::process::set_oom_score_adj(score)
    }
    fn enter_userns(&mut self, ns: OwnedFd) -> Result<(), InitError> {
        userns::enter(&ns).map_err(InitError::Userns)
    }
    fn fork(&mut self) -> Result<ForkResult, InitError> {
        // SAFETY: this process is single-threaded, so the child may run
        // arbitrary code after fork.
        unsafe { nix::unistd::fork() }.map_err(InitError::Fork)
    }
    fn reattach_cwd(&mut self, rootfs: &Path) -> Result<(), InitError> {
        userns::reattach_cwd().map_err(|message| InitError::Mount {
            step: "reattach rootfs",
            path: rootfs.to_path_buf(),
            message,
        })
    }
    fn pivot(&mut self, new_root: &Path) -> Result<(), InitError> {
        mounts::pivot(new_root)
    }
    fn mask(&mut self, path: &Path) -> Result<(), InitError> {
        mounts::mask(path)
    }
    fn make_readonly(&mut self, path: &Path) -> Result<(), InitError> {
        mounts::make_readonly(path)
    }
    fn readonly_root(&mut self) -> Result<(), InitError> {
        mounts::readonly_root()
    }
    fn sethostname(&mut self, name: &str) -> Result<(), InitError> {
        nix::unistd::sethostname(name).map_err(InitError::Hostname)
    }
    fn loopback_up(&mut self) -> Result<(), InitError> {
        crate::process::loopback_up()
    }
    fn umask(&mut self, mask: u32) {
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
    }
    fn close_other_fds(&mut self, keep: Option<RawFd>) -> Result<(), InitError> {
        crate::process::close_other_fds(keep)
    }
    fn drop_inheritable_caps(&mut self) -> Result<(), InitError> {
        crate::process::drop_inheritable_caps()
    }
    fn switch_user(&mut self, user: &User, may_setgroups: bool) -> Result<(), InitError> {
        crate::process::switch_user(user, may_setgroups)
    }
    fn verify_no_caps(&mut self) -> Result<(), InitError> {
        crate::process::verify_no_caps()
    }
    fn enter_workdir(&mut self, cwd: &Path) -> Result<(), InitError> {
        crate::enter_workdir(cwd)
    }
    fn no_new_privs(&mut self) -> Result<(), InitError> {
        nix::sys::prctl::set_no_new_privs().map_err(InitError::NoNewPrivs)
    }
    fn install_seccomp(&mut self, filters: &[Program]) -> Result<(), InitError> {
        sandbox_abi::bpf::install(filters).map_err(|e| InitError::Seccomp(e.to_string()))
    }
    fn exec(&mut self, path: &CString, argv: &[CString], envp: &[CString]) -> InitError {
        let e = nix::unistd::execve(path, argv, envp).unwrap_err();
        InitError::Exec {
            path: path.to_string_lossy().to_string(),
            source: e,
        }
    }
}
