//! Mount steps of the launcher: the OCI mount table applied beneath the
//! rootfs, device nodes, `pivot_root`, masked and read-only paths.
//!
//! Runs inside the sandbox's fresh, private mount namespace only: nothing
//! here is visible on the host.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use oci_spec::runtime::{LinuxDevice, LinuxDeviceType, Mount};

use super::InitError;
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
fn make_mount_point(target: &Path, is_file: bool) -> Result<(), InitError> {
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

/// Applies one OCI mount beneath `rootfs`. Bind sources are opened with
/// no symlink in any component and mounted from the opened fd.
pub fn apply(rootfs: &Path, m: &Mount) -> Result<(), InitError> {
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

/// Creates the device nodes listed in the spec under `rootfs/dev`.
pub fn create_devices(rootfs: &Path, devices: &[LinuxDevice]) -> Result<(), InitError> {
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
            Some(nix::unistd::Uid::from_raw(d.uid().unwrap_or(0))),
            Some(nix::unistd::Gid::from_raw(d.gid().unwrap_or(0))),
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
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| err("remount root read-only", Path::new("/"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
