//! Mount steps of the launcher: the OCI mount table applied beneath the
//! rootfs, device nodes, `pivot_root`, masked and read-only paths.
//!
//! Runs inside the sandbox's fresh, private mount namespace only: nothing
//! here is visible on the host.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::spec::{LinuxDevice, LinuxDeviceType, Mount};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use super::InitError;
use crate::userns::IdMap;
use sandbox_abi::paths;

/// Splits OCI mount options into mount flags and filesystem data.
pub fn parse_options(options: &[String]) -> (MsFlags, bool, String) {
    let mut flags = MsFlags::empty();
    let mut recursive = false;
    let mut data = Vec::new();
    for o in options {
        match o.as_str() {
            "ro" => flags |= MsFlags::MS_RDONLY,
            "rw" => flags.remove(MsFlags::MS_RDONLY),
            "nosuid" => flags |= MsFlags::MS_NOSUID,
            "suid" => flags.remove(MsFlags::MS_NOSUID),
            "nodev" => flags |= MsFlags::MS_NODEV,
            "dev" => flags.remove(MsFlags::MS_NODEV),
            "noexec" => flags |= MsFlags::MS_NOEXEC,
            "exec" => flags.remove(MsFlags::MS_NOEXEC),
            "strictatime" => flags |= MsFlags::MS_STRICTATIME,
            "relatime" => flags |= MsFlags::MS_RELATIME,
            "noatime" => flags |= MsFlags::MS_NOATIME,
            "bind" => flags |= MsFlags::MS_BIND,
            "rbind" => {
                flags |= MsFlags::MS_BIND;
                recursive = true;
            }
            "private" | "rprivate" | "slave" | "rslave" | "shared" | "rshared" => {}
            other => data.push(other.to_string()),
        }
    }
    (flags, recursive, data.join(","))
}

/// `dest` beneath `rootfs` (destinations are absolute container paths).
pub fn beneath(rootfs: &Path, dest: &Path) -> PathBuf {
    rootfs.join(dest.strip_prefix("/").unwrap_or(dest))
}

fn err(step: &'static str, path: &Path, e: impl std::fmt::Display) -> InitError {
    InitError::Mount {
        step,
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Creates the mount point: a directory, or an empty file when the source
/// is a file.
pub fn make_mount_point(target: &Path, is_file: bool) -> Result<(), InitError> {
    if target.symlink_metadata().is_ok() {
        return Ok(());
    }
    let parent = target.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(|e| err("mkdir", parent, e))?;
    if is_file {
        std::fs::write(target, b"").map_err(|e| err("create mount point", target, e))
    } else {
        std::fs::create_dir(target).map_err(|e| err("mkdir", target, e))
    }
}

/// The sandbox's user namespace, for the mounts the launcher makes as
/// host root before it enters it (see [`userns`](crate::userns)).
pub struct Idmap<'a> {
    /// The namespace every bind mount is idmapped through.
    pub userns: BorrowedFd<'a>,
    /// Its maps: `uid=`/`gid=` options of filesystems mounted before the
    /// join are translated to the host ids they stand for.
    pub uid: &'a [IdMap],
    pub gid: &'a [IdMap],
}

/// Mounts that must be made inside the sandbox's namespaces (the procfs
/// of its PID namespace, the sysfs of its network namespace, the mqueue
/// of its IPC namespace, a devpts whose `gid=` means its own group): with
/// a user namespace they are made by PID 1 after the join, the others by
/// the launcher before it.
pub fn is_deferred(m: &Mount) -> bool {
    matches!(
        m.typ().as_deref(),
        Some("proc" | "sysfs" | "mqueue" | "devpts")
    )
}

/// `uid=N`/`gid=N` filesystem options with `N` translated by the maps.
fn translate_ids(data: &str, idmap: &Idmap<'_>, target: &Path) -> Result<String, InitError> {
    data.split(',')
        .filter(|o| !o.is_empty())
        .map(|o| {
            let (key, maps) = match o.split_once('=') {
                Some(("uid", _)) => ("uid", idmap.uid),
                Some(("gid", _)) => ("gid", idmap.gid),
                _ => return Ok(o.to_string()),
            };
            let id: u32 = o[key.len() + 1..]
                .parse()
                .map_err(|_| err("mount option", target, format!("bad {o:?}")))?;
            let host = crate::userns::to_host(maps, id).ok_or_else(|| {
                err(
                    "mount option",
                    target,
                    format!("{o:?}: {key} {id} is not mapped in the user namespace"),
                )
            })?;
            Ok(format!("{key}={host}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.join(","))
}

/// Applies one OCI mount beneath `rootfs`. Bind sources are opened with
/// no symlink in any component and mounted from the opened fd (with a
/// user namespace, as a detached idmapped copy of that fd).
pub fn apply(rootfs: &Path, m: &Mount, idmap: Option<&Idmap<'_>>) -> Result<(), InitError> {
    let target = beneath(rootfs, m.destination());
    let options = m.options().clone().unwrap_or_default();
    let (flags, recursive, data) = parse_options(&options);
    let typ = m.typ().clone().unwrap_or_default();
    if typ == "bind" || flags.contains(MsFlags::MS_BIND) {
        let src = m
            .source()
            .as_ref()
            .ok_or_else(|| err("bind", &target, "no source"))?;
        let fd = paths::open_any_nofollow(src).map_err(|e| err("open bind source", src, e))?;
        let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd))
            .map_err(|e| err("stat bind source", src, e))?;
        let is_file = (st.st_mode & libc::S_IFMT) != libc::S_IFDIR;
        make_mount_point(&target, is_file)?;
        if let Some(idmap) = idmap {
            let attrs = crate::userns::attrs_of(flags);
            return crate::userns::bind_idmapped(
                fd.as_fd(),
                &target,
                recursive,
                attrs,
                idmap.userns,
            )
            .map_err(|e| err("idmapped bind", &target, e));
        }
        let mut bind = MsFlags::MS_BIND;
        if recursive {
            bind |= MsFlags::MS_REC;
        }
        mount(
            Some(&paths::fd_path(&fd)),
            &target,
            None::<&str>,
            bind,
            None::<&str>,
        )
        .map_err(|e| err("bind", &target, e))?;
        let extra = flags & !(MsFlags::MS_BIND);
        if !extra.is_empty() {
            mount(
                None::<&str>,
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | extra,
                None::<&str>,
            )
            .map_err(|e| err("remount bind", &target, e))?;
        }
        return Ok(());
    }
    make_mount_point(&target, false)?;
    let data = match idmap {
        Some(idmap) => {
            // A tmpfs made before the join belongs to the sandbox's root
            // unless its options name an owner.
            let mut data = data;
            if typ == "tmpfs" {
                for key in ["uid", "gid"] {
                    if !data.split(',').any(|o| o.starts_with(&format!("{key}="))) {
                        if !data.is_empty() {
                            data.push(',');
                        }
                        data.push_str(&format!("{key}=0"));
                    }
                }
            }
            translate_ids(&data, idmap, &target)?
        }
        None => data,
    };
    let source = m
        .source()
        .as_ref()
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_else(|| typ.clone());
    mount(
        Some(source.as_str()),
        &target,
        Some(typ.as_str()),
        flags,
        (!data.is_empty()).then_some(data.as_str()),
    )
    .map_err(|e| err("mount", &target, e))
}

/// A bind mount whose options ask for `slave` (or `rslave`) propagation:
/// a warm-pool member's attach points (`/home/gem/user-data`,
/// `/home/gem/skills`), which receive, from the daemon's side, the user's
/// directories when the member is claimed (see `docs/security.md`).
pub fn is_slave_bind(m: &Mount) -> bool {
    let options = m.options().as_deref().unwrap_or_default();
    m.typ().as_deref() == Some("bind") && options.iter().any(|o| o == "slave" || o == "rslave")
}

/// The detached copies of the sources of the slave binds, made before the
/// launcher leaves the daemon's mount namespace: each joins the peer group
/// of its (shared) source there, which a copy made in the sandbox's own
/// namespace would not (the launcher makes every mount of it private).
pub struct SlaveTrees(Vec<(PathBuf, std::os::fd::OwnedFd)>);

impl SlaveTrees {
    pub fn open(mounts: &[Mount]) -> Result<SlaveTrees, InitError> {
        let mut trees = Vec::new();
        for m in mounts.iter().filter(|m| is_slave_bind(m)) {
            let src = m
                .source()
                .as_ref()
                .ok_or_else(|| err("slave bind", m.destination(), "no source"))?;
            let fd = paths::open_dir_nofollow(src).map_err(|e| err("open slave source", src, e))?;
            let tree = sandbox_abi::mountapi::clone_tree(fd.as_fd(), false)
                .map_err(|e| err("open_tree", src, e))?;
            trees.push((m.destination().clone(), tree));
        }
        Ok(SlaveTrees(trees))
    }

    /// Attaches the copy for `m` beneath `rootfs` as a slave of its
    /// source's peer group, with `m`'s flags (`nosuid`, `nodev`, ...).
    /// False when `m` is not a slave bind.
    pub fn apply(&mut self, rootfs: &Path, m: &Mount) -> Result<bool, InitError> {
        let Some(i) = self.0.iter().position(|(d, _)| d == m.destination()) else {
            return Ok(false);
        };
        let (_, tree) = self.0.swap_remove(i);
        let target = beneath(rootfs, m.destination());
        let (flags, _, _) = parse_options(&m.options().clone().unwrap_or_default());
        make_mount_point(&target, false)?;
        sandbox_abi::mountapi::mount_setattr(
            tree.as_fd(),
            false,
            crate::userns::attrs_of(flags),
            sandbox_abi::mountapi::Propagation::Slave,
            None,
        )
        .map_err(|e| err("make slave", &target, e))?;
        sandbox_abi::mountapi::attach(tree.as_fd(), &target)
            .map_err(|e| err("attach slave", &target, e))?;
        Ok(true)
    }
}

/// Creates the device nodes listed in the spec under `rootfs/dev`.
/// With a user namespace (`uid`/`gid` maps, nodes made before the join)
/// their owners are the host ids the sandbox sees as theirs.
pub fn create_devices(
    rootfs: &Path,
    devices: &[LinuxDevice],
    uid: Option<&[IdMap]>,
    gid: Option<&[IdMap]>,
) -> Result<(), InitError> {
    let host = |maps: Option<&[IdMap]>, id: u32| match maps {
        Some(m) => crate::userns::to_host(m, id).unwrap_or(id),
        None => id,
    };
    for d in devices {
        let target = beneath(rootfs, d.path());
        let kind = match d.typ() {
            LinuxDeviceType::C | LinuxDeviceType::U => SFlag::S_IFCHR,
            LinuxDeviceType::B => SFlag::S_IFBLK,
            LinuxDeviceType::P => SFlag::S_IFIFO,
            LinuxDeviceType::A => continue,
        };
        let mode = d.file_mode().unwrap_or(0o666);
        let _ = std::fs::remove_file(&target);
        mknod(
            &target,
            kind,
            Mode::from_bits_truncate(mode),
            makedev(d.major() as u64, d.minor() as u64),
        )
        .map_err(|e| err("mknod", &target, e))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(|e| err("chmod device", &target, e))?;
        nix::unistd::chown(
            &target,
            Some(nix::unistd::Uid::from_raw(host(uid, d.uid().unwrap_or(0)))),
            Some(nix::unistd::Gid::from_raw(host(gid, d.gid().unwrap_or(0)))),
        )
        .map_err(|e| err("chown device", &target, e))?;
    }
    // The conventional links every program expects.
    for (link, to) in [
        ("dev/fd", "/proc/self/fd"),
        ("dev/stdin", "/proc/self/fd/0"),
        ("dev/stdout", "/proc/self/fd/1"),
        ("dev/stderr", "/proc/self/fd/2"),
        ("dev/ptmx", "pts/ptmx"),
    ] {
        let p = rootfs.join(link);
        if p.symlink_metadata().is_err() {
            symlink(to, &p).map_err(|e| err("symlink", &p, e))?;
        }
    }
    Ok(())
}

/// Makes `rootfs` the root: bind it onto itself (pivot_root needs a mount
/// point), pivot with the old root stacked beneath, then detach the old
/// root so no host path stays reachable.
pub fn pivot(rootfs: &Path) -> Result<(), InitError> {
    nix::unistd::chdir(rootfs).map_err(|e| err("chdir rootfs", rootfs, e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| err("pivot_root", rootfs, e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| err("detach old root", rootfs, e))?;
    nix::unistd::chdir("/").map_err(|e| err("chdir /", rootfs, e))
}

/// Bind-mounts the rootfs onto itself so it is a mount point.
pub fn bind_rootfs(rootfs: &Path) -> Result<(), InitError> {
    mount(
        Some(rootfs),
        rootfs,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| err("bind rootfs", rootfs, e))
}

/// Hides `path` (inside the new root): a read-only empty tmpfs over a
/// directory, `/dev/null` over anything else. Missing paths are skipped.
pub fn mask(path: &Path) -> Result<(), InitError> {
    let Ok(md) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if md.is_dir() {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=0k,mode=000"),
        )
        .map_err(|e| err("mask", path, e))
    } else {
        mount(
            Some("/dev/null"),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| err("mask", path, e))
    }
}

/// Makes `path` (inside the new root) read-only. Missing paths are skipped.
pub fn make_readonly(path: &Path) -> Result<(), InitError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| err("bind readonly path", path, e))?;
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| err("remount readonly path", path, e))
}

/// Remounts the new root read-only.
pub fn readonly_root() -> Result<(), InitError> {
    remount_readonly(Path::new("/"))
}

/// Mounts a small tmpfs of the sandbox's own over `rootfs` (the bundle's
/// empty directory) and makes `skeleton` in it: the root the daemon asked
/// for with [`sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION`]. Called in
/// the launcher's private mount namespace, before the rootfs is bound and
/// the mount table applied (the mount points those need are made in this
/// tmpfs like in any rootfs). Owned by host root, mode 0755, and made
/// read-only with the rest of the root.
pub fn root_tmpfs(
    rootfs: &Path,
    skeleton: &sandbox_abi::handoff::RootSkeleton,
) -> Result<(), InitError> {
    check_skeleton(skeleton).map_err(|m| err("root skeleton", rootfs, m))?;
    mount(
        Some("tmpfs"),
        rootfs,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755,size=1m,nr_inodes=4096"),
    )
    .map_err(|e| err("mount root tmpfs", rootfs, e))?;
    for d in &skeleton.dirs {
        let target = beneath(rootfs, Path::new(d));
        std::fs::create_dir(&target).map_err(|e| err("mkdir", &target, e))?;
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| err("chmod", &target, e))?;
    }
    for (name, target) in &skeleton.links {
        let link = beneath(rootfs, Path::new(name));
        std::os::unix::fs::symlink(target, &link).map_err(|e| err("symlink", &link, e))?;
    }
    Ok(())
}

/// Every name of the skeleton is a plain relative path (nothing made
/// outside the root).
fn check_skeleton(skeleton: &sandbox_abi::handoff::RootSkeleton) -> Result<(), String> {
    let plain = |name: &str| {
        !name.is_empty()
            && Path::new(name)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    match skeleton
        .dirs
        .iter()
        .chain(skeleton.links.iter().map(|(n, _)| n))
        .find(|n| !plain(n))
    {
        Some(bad) => Err(format!("{bad:?} is not a relative path")),
        None => Ok(()),
    }
}

/// Remounts the mount at `path` (a bind) read-only.
pub fn remount_readonly(path: &Path) -> Result<(), InitError> {
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| err("remount root read-only", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skeleton_names_nothing_outside_the_root() {
        use sandbox_abi::handoff::RootSkeleton;
        let ok = RootSkeleton {
            dirs: vec!["usr".into(), "var/tmp".into(), ".sandboxd".into()],
            links: vec![("bin".into(), "usr/bin".into())],
        };
        assert!(check_skeleton(&ok).is_ok());
        for bad in ["../x", "/etc", "a/../../b", "", "."] {
            let mut s = ok.clone();
            s.dirs.push(bad.into());
            assert!(check_skeleton(&s).is_err(), "{bad:?}");
            let mut s = ok.clone();
            s.links.push((bad.into(), "usr/bin".into()));
            assert!(check_skeleton(&s).is_err(), "link {bad:?}");
        }
    }

    #[test]
    fn options() {
        let o: Vec<String> = ["rbind", "ro", "nosuid", "mode=755", "size=1m"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (f, rec, data) = parse_options(&o);
        assert!(f.contains(MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID));
        assert!(rec);
        assert_eq!(data, "mode=755,size=1m");
        assert_eq!(
            beneath(Path::new("/b/rootfs"), Path::new("/etc/passwd")),
            PathBuf::from("/b/rootfs/etc/passwd")
        );
    }
}
