//! What a sandbox looks like from inside, the same for every backend: each
//! backend turns [`GUEST`] into its own mounts (OCI mounts for the native
//! one, volumes and volume mounts for Kubernetes), and the host-side names
//! of a user's directories are built here only.

use std::path::PathBuf;

/// The sandbox's filesystem and user, as its programs see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLayout {
    /// `$HOME`, a tmpfs (native) or emptyDir (Kubernetes).
    pub home: &'static str,
    /// `/tmp`, a tmpfs or emptyDir.
    pub tmp: &'static str,
    /// The user's workspace (persistent) or scratch space (ephemeral), rw.
    pub user_data: &'static str,
    /// The user's skills, read-only (persistent sandboxes only).
    pub skills: &'static str,
    /// The sandbox user and group: every command runs as them.
    pub uid: u32,
    pub gid: u32,
    /// The user's name in the generated `/etc/passwd`.
    pub user_name: &'static str,
    /// Where the agent binary is bound in (native backend).
    pub agent_path: &'static str,
    /// The agent's default port (the configured `container_port` wins).
    pub agent_port: u16,
    /// Where the native backend binds the command environment file the
    /// agent reads at start (`--command-env`).
    pub command_env_path: &'static str,
}

/// The one layout every sandbox has.
pub const GUEST: GuestLayout = GuestLayout {
    home: "/home/gem",
    tmp: "/tmp",
    user_data: "/home/gem/user-data",
    skills: "/home/gem/skills",
    uid: 1000,
    gid: 1000,
    user_name: "gem",
    agent_path: "/.sandboxd/sandbox-agent",
    agent_port: 8080,
    command_env_path: "/.sandboxd/command-env",
};

impl GuestLayout {
    /// The working directory of a sandbox: the workdir below the user data,
    /// or the home directory without one.
    pub fn cwd(&self, workdir_path: Option<&str>) -> String {
        match workdir_path {
            Some(w) => format!("{}/{w}", self.user_data),
            None => self.home.to_string(),
        }
    }

    /// The variables every sandbox gets, whatever the caller sends.
    pub fn fixed_env(&self) -> [(&'static str, String); 4] {
        [
            ("USER", self.user_name.to_string()),
            ("USER_UID", self.uid.to_string()),
            ("USER_GID", self.gid.to_string()),
            ("HOME", self.home.to_string()),
        ]
    }
}

/// A user's workspace, relative to the user-data root (host directory or
/// the user-data PVC): `shared/<uid>/workspace`.
pub fn workspace_rel(uid: &str) -> PathBuf {
    ["shared", uid, "workspace"].iter().collect()
}

/// A user's skills, relative to the native skills root: `<uid>`.
pub fn native_skills_rel(uid: &str) -> PathBuf {
    PathBuf::from(uid)
}

/// A user's skills, relative to the skills PVC (Kubernetes):
/// `skill-projections/<uid>`, the replaced provisioner's layout.
pub fn kube_skills_rel(uid: &str) -> PathBuf {
    ["skill-projections", uid].iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_and_paths() {
        assert_eq!(GUEST.cwd(Some("p/q")), "/home/gem/user-data/p/q");
        assert_eq!(GUEST.cwd(None), "/home/gem");
        assert!(GUEST.user_data.starts_with(GUEST.home));
        assert!(GUEST.skills.starts_with(GUEST.home));
        assert_eq!(workspace_rel("u1"), PathBuf::from("shared/u1/workspace"));
        assert_eq!(kube_skills_rel("u1"), PathBuf::from("skill-projections/u1"));
    }
}
