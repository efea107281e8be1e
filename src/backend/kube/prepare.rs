//! The init step of every sandbox Pod, `sandboxd kube prepare`, run from
//! the `sandboxd` image as uid 1000 with no capability (PSS "restricted").
//!
//! 1. It copies the static agent out of the `sandboxd` image into the
//!    Pod's agent emptyDir (mounted read-only in the sandbox container,
//!    which runs it as PID 1): the sandbox image can be any userland.
//! 2. For a persistent sandbox with a user-data PVC (mounted at its root
//!    here only), it creates missing directories of
//!    `shared/<uid>/workspace` and `skill-projections/<uid>` mode 0700, one
//!    component at a time below an fd with `openat2(RESOLVE_NO_SYMLINKS |
//!    RESOLVE_BENEATH)` (`sandbox_abi::paths`, the native backend's code),
//!    refusing any component that is a symlink or not a directory
//!    ([`EXIT_UNSAFE_PATH`]), and checks that the workdir exists below the
//!    workspace with no symlink component ([`EXIT_BAD_WORKDIR`]).
//!
//! As uid 1000 it can only create what the PVC lets uid/gid 1000 create:
//! `fsGroup: 1000` makes the kubelet give the volume's group to 1000 on
//! drivers that support it; data written by older deployments as root is
//! made writable once by the ownership migration (`sandboxd kube
//! migrate-ownership`, [`super::migrate`]). A permission failure exits
//! [`EXIT_NOT_WRITABLE`] and the create answers 500 saying so.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use sandbox_abi::layout;
use sandbox_abi::paths::{self, PathError};

use super::spec::{agent_dir, mount, restricted, AGENT_VOLUME};
use sandbox_abi::layout::GUEST;

/// Name of the init container.
pub const INIT_CONTAINER: &str = "sandboxd-prepare";
/// Exit code when the workdir is missing or not a directory.
pub const EXIT_BAD_WORKDIR: i32 = 42;
/// Exit code when a path component is a symlink or not a directory.
pub const EXIT_UNSAFE_PATH: i32 = 41;
/// Exit code when a directory cannot be created (the PVC is not writable
/// by uid/gid 1000: run the ownership migration).
pub const EXIT_NOT_WRITABLE: i32 = 43;

/// Mount points of the PVC roots inside the init container.
pub const USER_DATA_ROOT: &str = "/pvc/user-data";
pub const SKILLS_ROOT: &str = "/pvc/skills";
/// Where the `sandboxd` image holds its binaries (see `Dockerfile`).
pub const IMAGE_BIN_DIR: &str = "/usr/local/bin";

/// The per-user part of the init step (persistent sandboxes with a PVC).
#[derive(Debug, Clone, Copy)]
pub struct UserDirs<'a> {
    pub uid: &'a str,
    pub workdir: Option<&'a str>,
    pub skills: bool,
}

/// The init container of a sandbox Pod.
pub fn init_container(agent_image: &str, dirs: Option<UserDirs<'_>>) -> Container {
    let mut command = vec![
        format!("{IMAGE_BIN_DIR}/sandboxd"),
        "kube".into(),
        "prepare".into(),
        format!("--agent-from={IMAGE_BIN_DIR}/sandbox-agent"),
        format!("--agent-to={}", GUEST.agent_path),
    ];
    let mut mounts = vec![mount(AGENT_VOLUME, agent_dir(), None, false)];
    if let Some(d) = dirs {
        // `--name=value`: a value starting with '-' stays a value.
        command.push(format!("--user-data={USER_DATA_ROOT}"));
        command.push(format!("--uid={}", d.uid));
        if let Some(w) = d.workdir {
            command.push(format!("--workdir={w}"));
        }
        mounts.push(mount("user-data", USER_DATA_ROOT, None, false));
        if d.skills {
            command.push(format!("--skills={SKILLS_ROOT}"));
            mounts.push(mount("skills", SKILLS_ROOT, None, false));
        }
    }
    let small = std::collections::BTreeMap::from([
        ("cpu".to_string(), Quantity("100m".into())),
        ("memory".to_string(), Quantity("64Mi".into())),
    ]);
    Container {
        name: INIT_CONTAINER.into(),
        image: Some(agent_image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(command),
        security_context: Some(restricted()),
        resources: Some(ResourceRequirements {
            requests: Some(small.clone()),
            limits: Some(small),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// Arguments of `sandboxd kube prepare` (what [`init_container`] passes).
#[derive(Debug, Clone, clap::Args)]
pub struct PrepareArgs {
    /// The static agent to copy.
    #[arg(long)]
    pub agent_from: PathBuf,
    /// Where to copy it (in the agent emptyDir).
    #[arg(long)]
    pub agent_to: PathBuf,
    /// Root of the user-data PVC.
    #[arg(long, requires = "uid")]
    pub user_data: Option<PathBuf>,
    #[arg(long)]
    pub uid: Option<String>,
    #[arg(long, requires = "user_data")]
    pub workdir: Option<String>,
    /// Root of the skills PVC.
    #[arg(long, requires = "user_data")]
    pub skills: Option<PathBuf>,
}

/// Why the init step failed, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot install the agent at {path}: {source}")]
    Install {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsafe(PathError),
    #[error("workdir_path: {0}")]
    BadWorkdir(PathError),
    #[error("{0} (is the PVC writable by uid/gid 1000? see the ownership migration in docs/kubernetes.md)")]
    NotWritable(PathError),
}

impl PrepareError {
    pub fn exit_code(&self) -> i32 {
        match self {
            PrepareError::Install { .. } => 1,
            PrepareError::Unsafe(_) => EXIT_UNSAFE_PATH,
            PrepareError::BadWorkdir(_) => EXIT_BAD_WORKDIR,
            PrepareError::NotWritable(_) => EXIT_NOT_WRITABLE,
        }
    }
}

fn dirs_error(e: PathError) -> PrepareError {
    match e {
        PathError::Create { .. } | PathError::Open { .. } => PrepareError::NotWritable(e),
        e => PrepareError::Unsafe(e),
    }
}

/// Copies the agent (mode 0555, through a temporary name).
fn install(from: &Path, to: &Path) -> Result<(), PrepareError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| PrepareError::Install {
        path: to.to_path_buf(),
        source,
    };
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555)).map_err(err)?;
    std::fs::rename(&tmp, to).map_err(err)
}

/// The whole init step.
pub fn run(a: &PrepareArgs) -> Result<(), PrepareError> {
    install(&a.agent_from, &a.agent_to)?;
    let (Some(root), Some(uid)) = (&a.user_data, &a.uid) else {
        return Ok(());
    };
    let workspace =
        paths::ensure_user_dirs(root, &layout::workspace_rel(uid)).map_err(dirs_error)?;
    if let Some(w) = &a.workdir {
        let shown = root.join(layout::workspace_rel(uid)).join(w);
        paths::open_beneath(&workspace, Path::new(w), &shown).map_err(PrepareError::BadWorkdir)?;
    }
    if let Some(skills) = &a.skills {
        match paths::ensure_user_dirs(skills, &layout::kube_skills_rel(uid)) {
            Ok(_) => {}
            // Read-only in the sandbox: when uid 1000 may not create it,
            // the kubelet creates the subPath (root-owned) instead.
            Err(e @ (PathError::Create { .. } | PathError::Open { .. })) => {
                eprintln!("sandboxd kube prepare: warning: {e}; the kubelet will create it");
            }
            Err(e) => return Err(PrepareError::Unsafe(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn args(root: &Path, uid: &str, workdir: Option<&str>) -> PrepareArgs {
        let from = root.join("agent-src");
        std::fs::write(&from, b"agent").unwrap();
        std::fs::create_dir_all(root.join("agent")).unwrap();
        std::fs::create_dir_all(root.join("ud")).unwrap();
        std::fs::create_dir_all(root.join("sk")).unwrap();
        PrepareArgs {
            agent_from: from,
            agent_to: root.join("agent/sandbox-agent"),
            user_data: Some(root.join("ud")),
            uid: Some(uid.into()),
            workdir: workdir.map(String::from),
            skills: Some(root.join("sk")),
        }
    }

    #[test]
    fn installs_the_agent_creates_dirs_and_refuses_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        run(&args(&root, "alice", None)).unwrap();
        let agent = std::fs::metadata(root.join("agent/sandbox-agent")).unwrap();
        assert_eq!(agent.permissions().mode() & 0o777, 0o555);
        let ws = root.join("ud/shared/alice/workspace");
        assert_eq!(
            std::fs::metadata(&ws).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(root.join("sk/skill-projections/alice").is_dir());

        // Missing workdir: 42; present: fine; through a symlink: 42.
        let e = run(&args(&root, "alice", Some("projects/p1"))).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_BAD_WORKDIR, "{e}");
        std::fs::create_dir_all(ws.join("projects/p1")).unwrap();
        run(&args(&root, "alice", Some("projects/p1"))).unwrap();
        std::os::unix::fs::symlink(ws.join("projects"), ws.join("link")).unwrap();
        let e = run(&args(&root, "alice", Some("link/p1"))).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_BAD_WORKDIR, "{e}");

        // A user's directory replaced by a symlink: 41, nothing made
        // through it.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("ud/shared/bob")).unwrap();
        let e = run(&args(&root, "bob", None)).unwrap_err();
        assert_eq!(e.exit_code(), EXIT_UNSAFE_PATH, "{e}");
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
    }
}
