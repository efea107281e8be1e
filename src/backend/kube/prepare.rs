//! The init container that prepares a user's directories on the PVCs
//! before the sandbox container mounts them by `subPath`.
//!
//! It is the only part of a sandbox Pod that runs as root, with just
//! `CHOWN`, `DAC_OVERRIDE` and `FOWNER`. It creates missing directories of
//! `shared/<uid>/workspace` (user-data PVC) and `skill-projections/<uid>`
//! (skills PVC) with mode 0700 owned 1000:1000, component by component,
//! refusing any component that is a symlink, and checks that the workdir
//! exists below the workspace with no symlink component. The names it
//! receives are validated (`[A-Za-z0-9_-]+`, workdir components with no
//! `.`/`..`) and passed as arguments, never interpolated into the script.

use k8s_openapi::api::core::v1::{Capabilities, Container, SecurityContext, VolumeMount};

/// Exit code of the script when the workdir is missing or not a directory.
pub const EXIT_BAD_WORKDIR: i32 = 42;
/// Exit code when a path component is a symlink or not a directory.
pub const EXIT_UNSAFE_PATH: i32 = 41;

/// Mount points of the PVC roots inside the init container.
pub const USER_DATA_ROOT: &str = "/pvc/user-data";
pub const SKILLS_ROOT: &str = "/pvc/skills";

/// `sh -c SCRIPT prepare <uid> <workdir or ""> <has skills: 0|1>`.
pub const SCRIPT: &str = r#"set -eu
umask 077
uid="$1"; workdir="$2"; skills="$3"
# ensure BASE REL: walk REL under BASE one component at a time; refuse
# symlinks; create missing directories 0700 owned 1000:1000.
ensure() {
  cur="$1"
  old_ifs="$IFS"; IFS=/; set -f
  for c in $2; do
    cur="$cur/$c"
    if [ -L "$cur" ]; then echo "refusing symlink $cur" >&2; exit 41; fi
    if [ ! -e "$cur" ]; then
      mkdir -m 0700 "$cur"
      chown -h 1000:1000 "$cur"
    fi
    if [ -L "$cur" ] || [ ! -d "$cur" ]; then echo "not a directory: $cur" >&2; exit 41; fi
  done
  IFS="$old_ifs"; set +f
}
# check BASE REL: every component must exist, be a directory, no symlink.
check() {
  cur="$1"
  old_ifs="$IFS"; IFS=/; set -f
  for c in $2; do
    cur="$cur/$c"
    if [ -L "$cur" ] || [ ! -d "$cur" ]; then
      echo "workdir_path does not name a directory without symlinks" >&2; exit 42
    fi
  done
  IFS="$old_ifs"; set +f
}
ensure /pvc/user-data "shared/$uid/workspace"
if [ -n "$workdir" ]; then check /pvc/user-data/shared/"$uid"/workspace "$workdir"; fi
if [ "$skills" = 1 ]; then ensure /pvc/skills "skill-projections/$uid"; fi
"#;

/// The init container for a persistent sandbox of `uid`.
pub fn init_container(image: &str, uid: &str, workdir: Option<&str>, skills: bool) -> Container {
    let mut mounts = vec![VolumeMount {
        name: "user-data".into(),
        mount_path: USER_DATA_ROOT.into(),
        ..Default::default()
    }];
    if skills {
        mounts.push(VolumeMount {
            name: "skills".into(),
            mount_path: SKILLS_ROOT.into(),
            ..Default::default()
        });
    }
    Container {
        name: "prepare-user-dirs".into(),
        image: Some(image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]),
        args: Some(vec![
            "prepare".into(),
            uid.into(),
            workdir.unwrap_or("").into(),
            if skills { "1" } else { "0" }.into(),
        ]),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["CHOWN".into(), "DAC_OVERRIDE".into(), "FOWNER".into()]),
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::process::Command;

    /// Runs the script with the PVC roots rewritten to temp dirs (as an
    /// unprivileged run: chown to 1000 only succeeds as root, so the
    /// ownership is only checked when the test runs as root).
    fn run(root: &std::path::Path, uid: &str, workdir: &str) -> (i32, String) {
        let script = SCRIPT
            .replace("/pvc/user-data", &root.join("ud").display().to_string())
            .replace("/pvc/skills", &root.join("sk").display().to_string());
        let out = Command::new("/bin/sh")
            .args(["-c", &script, "prepare", uid, workdir, "1"])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn script_creates_dirs_and_refuses_symlinks() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: prepare script test needs root (chown to 1000)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("ud")).unwrap();
        std::fs::create_dir_all(d.path().join("sk")).unwrap();
        let (code, err) = run(d.path(), "alice", "");
        assert_eq!(code, 0, "{err}");
        let ws = d.path().join("ud/shared/alice/workspace");
        let md = std::fs::metadata(&ws).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o700);
        assert_eq!((md.uid(), md.gid()), (1000, 1000));
        assert!(d.path().join("sk/skill-projections/alice").is_dir());

        // Missing workdir: exit 42; present: 0.
        assert_eq!(run(d.path(), "alice", "projects/p1").0, EXIT_BAD_WORKDIR);
        std::fs::create_dir_all(ws.join("projects/p1")).unwrap();
        assert_eq!(run(d.path(), "alice", "projects/p1").0, 0);
        // A symlinked workdir component: exit 42, even to a real dir.
        std::os::unix::fs::symlink(ws.join("projects"), ws.join("link")).unwrap();
        assert_eq!(run(d.path(), "alice", "link/p1").0, EXIT_BAD_WORKDIR);

        // A user's dir replaced by a symlink to somewhere else: refused, and
        // nothing is created through it.
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("ud/shared/bob")).unwrap();
        let (code, err) = run(d.path(), "bob", "");
        assert_eq!(code, EXIT_UNSAFE_PATH, "{err}");
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
    }
}
