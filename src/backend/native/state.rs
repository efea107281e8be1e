//! Per-sandbox state on disk: `<state_dir>/sandboxes/<id>/state.json`,
//! written atomically (temp file, rename; the first record of a create
//! also durably: fsync of the file and the directory), so a restarted
//! daemon can adopt running sandboxes and clean up dead ones.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{Identity, Resources};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
}

/// The fsync of a record written by [`StateDir::save_in_background`].
/// Dropped without [`wait`](Self::wait) (a create that failed first), the
/// thread finishes on its own.
#[must_use = "the record is durable only once wait() returned"]
pub struct PendingSync {
    handle: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    path: PathBuf,
}

impl PendingSync {
    /// Waits until the record is on disk.
    pub fn wait(mut self) -> Result<(), StateError> {
        let Some(h) = self.handle.take() else {
            return Ok(());
        };
        let source = match h.join() {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::other("the fsync thread panicked"),
        };
        Err(StateError::Write {
            path: std::mem::take(&mut self.path),
            source,
        })
    }
}

/// Where a sandbox is in its life (as last recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Creating,
    Running,
    Deleting,
    /// A warm-pool member: started, bound to no user (never adopted: a
    /// restarted daemon destroys it).
    Pooled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxState {
    pub sandbox_id: String,
    pub generation: String,
    pub identity: Identity,
    pub phase: Phase,
    /// Host PID of the sandbox's PID 1, once known.
    pub pid: Option<i32>,
    /// Its start time (clock ticks since boot), to defeat PID reuse.
    pub start_time: Option<u64>,
    pub cgroup: Option<String>,
    pub resources: Resources,
    pub created_at: u64,
    /// The sandbox's veth and address (egress only), once set up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<super::net::NetState>,
    /// The host ids of its user namespace (none without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<super::userns::UsernsRange>,
    /// The manifest digest of the image it runs (none: the host's
    /// userland). `image rm` and `gc` refuse to remove an image a record
    /// names (`crate::images::image_users`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Frozen or reclaimed by the hibernation ladder, and since when
    /// (none: active). Written before the cgroup is frozen and after it is
    /// thawed, so a restarted daemon never finds a frozen sandbox without
    /// a record of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::model::IdleMark>,
}

impl SandboxState {
    /// The name of its cgroup under the parent, from the recorded path.
    pub fn cgroup_key(&self) -> Option<String> {
        let cg = self.cgroup.as_deref()?;
        Path::new(cg)
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    }
}

/// The layout of the state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(state_dir: &Path) -> StateDir {
        StateDir {
            root: state_dir.join("sandboxes"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    pub fn bundle_dir(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("bundle")
    }

    fn state_path(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("state.json")
    }

    /// Writes `st` atomically (temp file, rename) but not durably: for the
    /// updates after a create's first, durable record
    /// ([`save_in_background`](Self::save_in_background)). A
    /// crash of the daemon loses nothing (the page cache has it); a crash
    /// of the host loses at most the update, and with it every sandbox
    /// process, so the durable record is what the next start needs.
    pub fn update(&self, st: &SandboxState) -> Result<(), StateError> {
        self.write_file(st).map(drop)
    }

    /// Writes `st` atomically, like [`update`](Self::update), and makes it
    /// durable (fsync of the file, then of the directory) on a thread of
    /// its own, so the create goes on while the disk works. The create
    /// waits for it ([`PendingSync::wait`]) before `state.json` is
    /// replaced by the next record and before it answers. A daemon crash
    /// meanwhile loses nothing (the page cache has the record); a host
    /// crash takes every process of the sandbox with it, and whatever of
    /// its directory is left (with or without a readable `state.json`) is
    /// removed by id at the next start.
    pub fn save_in_background(&self, st: &SandboxState) -> Result<PendingSync, StateError> {
        let path = self.state_path(&st.sandbox_id);
        let w = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        let file = self.write_file(st)?;
        let dir = std::fs::File::open(self.sandbox_dir(&st.sandbox_id)).map_err(w)?;
        let handle = std::thread::Builder::new()
            .name("state-fsync".into())
            .spawn(move || {
                file.sync_all()?;
                dir.sync_all()
            })
            .map_err(w)?;
        Ok(PendingSync {
            handle: Some(handle),
            path,
        })
    }

    /// Writes `st` to the temp file and renames it over `state.json`;
    /// returns the file (still open), not synced.
    fn write_file(&self, st: &SandboxState) -> Result<std::fs::File, StateError> {
        let dir = self.sandbox_dir(&st.sandbox_id);
        let path = self.state_path(&st.sandbox_id);
        let tmp = dir.join(".state.json.tmp");
        let w = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(st).expect("state serializes");
        let mut f = std::fs::File::create(&tmp).map_err(w)?;
        f.write_all(&json).map_err(w)?;
        std::fs::rename(&tmp, &path).map_err(w)?;
        Ok(f)
    }

    pub fn load(&self, id: &str) -> Result<Option<SandboxState>, StateError> {
        let path = self.state_path(id);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| StateError::Corrupt {
                    path,
                    message: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Read { path, source }),
        }
    }

    /// Ids of every sandbox directory (with or without state).
    pub fn ids(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::model::validate_node_key(n).is_ok())
            .collect();
        ids.sort();
        ids
    }

    /// Removes a sandbox's directory (state, bundle, log). Refuses when
    /// anything below it is still a mount point, so a leaked mount of user
    /// data can never be deleted through it.
    pub fn remove(&self, id: &str) -> Result<(), StateError> {
        remove_tree(self.sandbox_dir(id))
    }

    /// Removes a sandbox's bundle only (an exited sandbox: `state.json` and
    /// `agent.log` stay until it is deleted), with the same mount check.
    pub fn remove_bundle(&self, id: &str) -> Result<(), StateError> {
        remove_tree(self.bundle_dir(id))
    }
}

/// Removes `dir` and everything below it, unless a mount is below it.
fn remove_tree(dir: PathBuf) -> Result<(), StateError> {
    // Nothing there (a create's usual case): no mount table to read.
    if let Err(e) = std::fs::symlink_metadata(&dir) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Ok(());
        }
    }
    let prefix = format!("{}/", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some(line) = mounts.lines().find(|l| {
        l.split_whitespace()
            .nth(4)
            .is_some_and(|mp| mp.starts_with(&prefix) || mp == dir.to_string_lossy())
    }) {
        return Err(StateError::Write {
            path: dir,
            source: std::io::Error::other(format!(
                "refusing to remove: a mount is still below it ({line})"
            )),
        });
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Write { path: dir, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StorageMode;

    #[test]
    fn save_load_remove() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::new(t.path());
        std::fs::create_dir_all(sd.sandbox_dir("a")).unwrap();
        let st = SandboxState {
            sandbox_id: "a".into(),
            generation: "g".into(),
            identity: Identity {
                thread_id: "t".into(),
                uid: "u".into(),
                workdir_path: None,
                storage: StorageMode::Ephemeral,
                image: None,
            },
            phase: Phase::Creating,
            pid: None,
            start_time: None,
            cgroup: None,
            resources: Resources {
                memory_mb: 1,
                cpus: 1.0,
                pids: 1,
            },
            created_at: 0,
            network: None,
            userns: None,
            image: None,
            idle: None,
        };
        sd.save_in_background(&st).unwrap().wait().unwrap();
        assert_eq!(sd.load("a").unwrap().unwrap(), st);
        let mut later = st.clone();
        later.phase = Phase::Running;
        sd.update(&later).unwrap();
        assert_eq!(sd.load("a").unwrap().unwrap(), later);
        assert!(!sd.sandbox_dir("a").join(".state.json.tmp").exists());
        sd.update(&st).unwrap();
        std::fs::create_dir_all(sd.bundle_dir("a").join("rootfs")).unwrap();
        sd.remove_bundle("a").unwrap();
        assert!(!sd.bundle_dir("a").exists());
        assert_eq!(sd.load("a").unwrap().unwrap(), st);
        sd.remove_bundle("a").unwrap();
        assert_eq!(sd.ids(), vec!["a".to_string()]);
        std::fs::write(sd.sandbox_dir("a").join("state.json"), b"{").unwrap();
        assert!(sd.load("a").is_err());
        sd.remove("a").unwrap();
        assert!(sd.ids().is_empty());
        sd.remove("a").unwrap();
    }
}
