//! Where a sandbox's userland comes from: the one place the bundler
//! chooses between the host's (`[native] rootfs_binds` bound read-only
//! into the bundle's skeleton `rootfs/`) and an image's (the top-level
//! directories and files of the store's flattened, read-only root
//! filesystem of that image bound read-only into the same skeleton, its
//! top-level symlinks made there, and no host bind at all).
//!
//! The sandbox's `/` is always a skeleton of its own (the daemon's bundles:
//! a tmpfs `sandbox-init` makes over the bundle's empty `rootfs/`, see
//! [`super::bundle::annotate_root_skeleton`]), never the shared
//! image directory: with user namespaces the top mount is the one mount a
//! sandbox's root could remount writable (`pivot_root` refuses a locked
//! root), and the skeleton belongs to that sandbox alone, while every
//! image bind is a locked read-only (idmapped) mount like the host's
//! `/usr`.
//!
//! `/etc`: the host's userland gets the prepared `/etc` directory
//! ([`super::etc`]); an image keeps its own, with the shared generated
//! files (`passwd`, `group`, `resolv.conf`) bound over its files one by
//! one. Both get the sandbox's `hosts` and `hostname` bound over those.
//!
//! Everything else is the same in both modes: the agent bound in
//! read-only, tmpfs `/tmp` and `/home/gem`, user data and skills. The image's `Env` becomes the base of
//! the environment (the request's env and the fixed variables over it);
//! its `User`, `Entrypoint`, `Cmd` and `WorkingDir` are ignored.

use std::borrow::Cow;
use std::collections::BTreeMap;

use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use super::bundle::HostLayout;
use crate::images::ResolvedImage;

/// Top-level names of an image the runtime provides itself: never bound
/// from the image (its `/proc`, `/dev`, `/sys`, `/tmp` would only be
/// covered) and never made symlinks in the skeleton.
const RUNTIME_NAMES: [&str; 5] = ["proc", "sys", "dev", "tmp", ".sandboxd"];

/// Names the skeleton makes as directories (`bundle::SKELETON_DIRS`' top
/// level): an image's symlink of that name is not made (a directory of
/// that name is bound over the skeleton's).
const SKELETON_TOP: [&str; 10] = [
    "usr", "etc", "proc", "sys", "dev", "tmp", "home", "run", "var", "root",
];

/// The base spec and host layout a bundle is built from: unchanged for the
/// host's userland; for an image, the image's env, its top-level
/// directories and files as the read-only binds and its top-level symlinks
/// as the skeleton's, and no host rootfs binds (nor the `/usr/local`
/// cover, which belongs to them).
pub fn select<'a>(
    base: &'a Spec,
    host: &'a HostLayout,
    image: Option<&ResolvedImage>,
) -> Result<(Cow<'a, Spec>, Cow<'a, HostLayout>), String> {
    let Some(image) = image else {
        return Ok((Cow::Borrowed(base), Cow::Borrowed(host)));
    };
    let mut base = base.clone();
    if let Some(mut process) = base.process().clone() {
        let env = image_env_over(process.env().as_deref().unwrap_or_default(), &image.env);
        process.set_env(Some(env));
        base.set_process(Some(process));
    }
    let (binds, links) = top_level(&image.rootfs).map_err(|e| {
        format!(
            "image {} rootfs {}: {e}",
            image.reference,
            image.rootfs.display()
        )
    })?;
    let mut host = host.clone();
    host.rootfs_binds = binds;
    host.root_links = links;
    host.hide_usr_local = false;
    // Its own /etc, with the shared generated files bound over its files.
    host.etc_entries = Vec::new();
    host.own_etc = true;
    Ok((Cow::Owned(base), Cow::Owned(host)))
}

type Binds = Vec<(PathBuf, PathBuf)>;
type Links = Vec<(String, PathBuf)>;

/// The image root's top-level entries, read without following any of
/// them: directories and regular files become read-only binds (source in
/// the store, destination `/<name>`), symlinks become the skeleton's
/// (their targets are resolved inside the sandbox only). Anything else,
/// and the names the runtime provides, is left out. Sorted by name, so
/// bundles are reproducible.
fn top_level(rootfs: &Path) -> std::io::Result<(Binds, Links)> {
    let mut binds = Vec::new();
    let mut links = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(rootfs)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if RUNTIME_NAMES.contains(&name) {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() || kind.is_file() {
            binds.push((entry.path(), Path::new("/").join(name)));
        } else if kind.is_symlink() && !SKELETON_TOP.contains(&name) {
            links.push((name.to_string(), std::fs::read_link(entry.path())?));
        }
    }
    Ok((binds, links))
}

/// Checks that every mount destination of `spec` that lands in the image's
/// rootfs (not inside an earlier mount, such as `/dev/pts` in `/dev`'s
/// tmpfs, or in the skeleton's runtime directories) exists there, reached without any symlink. The store made them
/// when it unpacked the image; one missing (the base spec gained a mount
/// since) would make the launcher create it in the shared rootfs, joining
/// paths on the host: refused instead, with the fix.
pub fn check_mount_points(image: &ResolvedImage, spec: &Spec) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let root = rustix::fs::open(
        &image.rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| {
        format!(
            "image {} rootfs {}: {e}",
            image.reference,
            image.rootfs.display()
        )
    })?;
    let mut earlier: Vec<std::path::PathBuf> = Vec::new();
    for m in spec.mounts().iter().flatten() {
        let dest = m.destination().clone();
        // The image's own top-level binds: there by construction, and
        // what lands inside them is checked below.
        if m.source()
            .as_ref()
            .is_some_and(|s| s.starts_with(&image.rootfs))
        {
            continue;
        }
        if earlier.iter().any(|e| dest != *e && dest.starts_with(e)) {
            continue;
        }
        earlier.push(dest.clone());
        let rel = dest.strip_prefix("/").unwrap_or(&dest);
        // In the skeleton, not the image (`/proc`, `/dev`, `/tmp`, ...).
        let top = rel.components().next().and_then(|c| c.as_os_str().to_str());
        if rel.as_os_str().is_empty() || top.is_some_and(|t| RUNTIME_NAMES.contains(&t)) {
            continue;
        }
        rustix::fs::openat2(
            &root,
            rel,
            OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            format!(
                "image {} has no plain mount point {} ({e}): it was unpacked for another mount table; \
                 `sandboxd image rm` and pull (or import) it again",
                image.reference,
                dest.display()
            )
        })?;
    }
    Ok(())
}

/// `base` (`KEY=VALUE`) with the image's variables replacing those of the
/// same name (entries without `=` are dropped).
fn image_env_over(base: &[String], image: &[String]) -> Vec<String> {
    let mut vars: BTreeMap<&str, &str> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for kv in base.iter().chain(image) {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        if k.is_empty() {
            continue;
        }
        if vars.insert(k, v).is_none() {
            order.push(k);
        }
    }
    order.iter().map(|k| format!("{k}={}", vars[k])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_must_be_plain_in_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        for d in ["dev", "home/gem", "etc"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("etc/passwd"), "").unwrap();
        let image = ResolvedImage {
            reference: "r/x:1".into(),
            #[cfg(feature = "images")]
            digest: sandbox_image::Digest::of(b"x"),
            #[cfg(not(feature = "images"))]
            digest: "sha256:x".into(),
            rootfs: root.clone(),
            env: vec![],
        };
        let spec = |dests: &[&str]| -> Spec {
            let mounts: Vec<serde_json::Value> = dests
                .iter()
                .map(|d| serde_json::json!({"destination": d, "type": "tmpfs", "source": "tmpfs"}))
                .collect();
            serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2", "mounts": mounts}))
                .unwrap()
        };
        // Inside earlier mounts (/dev/pts, user data) need not exist.
        let ok = spec(&[
            "/dev",
            "/dev/pts",
            "/home/gem",
            "/home/gem/user-data",
            "/etc/passwd",
        ]);
        check_mount_points(&image, &ok).unwrap();
        let e = check_mount_points(&image, &spec(&["/srv"])).unwrap_err();
        assert!(e.contains("no plain mount point /srv"), "{e}");
        std::os::unix::fs::symlink("/etc", root.join("etc2")).unwrap();
        let e = check_mount_points(&image, &spec(&["/etc2/passwd"])).unwrap_err();
        assert!(e.contains("/etc2/passwd"), "{e}");
    }

    #[test]
    fn image_env_replaces_base() {
        let base = vec!["PATH=/usr/bin".to_string(), "LANG=C.UTF-8".to_string()];
        let image = vec![
            "PATH=/opt/py/bin:/usr/bin".to_string(),
            "PYTHON_VERSION=3.12".to_string(),
            "junk".to_string(),
        ];
        assert_eq!(
            image_env_over(&base, &image),
            vec![
                "PATH=/opt/py/bin:/usr/bin",
                "LANG=C.UTF-8",
                "PYTHON_VERSION=3.12"
            ]
        );
    }
}
