//! User namespaces of native sandboxes (`[userns]`, see
//! `docs/security.md#user-namespaces`): the start-up decision (a real
//! probe mount through `sandbox-init --probe-idmap`) and the pool of host
//! id ranges, one 65536-id slot per sandbox, recorded in `state.json`,
//! taken again on adoption and released on delete.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{display_as_word, key_word, ConfigError, KeyWord};

/// Whether native sandboxes get a user namespace (`[userns] mode`,
/// `SANDBOXD_USERNS`; see `docs/security.md#user-namespaces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UsernsMode {
    /// `auto` (default): on when the kernel and the filesystems of the
    /// user-data and skills roots (and the other bound paths) support
    /// idmapped mounts, checked at start with a probe mount; off
    /// otherwise, said in the log.
    Auto,
    /// `on`: the daemon refuses to start without that support.
    On,
    /// `off`: every sandbox runs as host uid 1000 (the behaviour before
    /// user namespaces).
    Off,
}

impl KeyWord for UsernsMode {
    const KEY: &'static str = "userns.mode";
}

display_as_word!(UsernsMode);

/// Host ids of one sandbox's user namespace: container ids `0..65536`.
pub const USERNS_SLOT: u32 = 65536;

/// User namespaces of native sandboxes (`[userns]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UsernsConfig {
    #[serde(deserialize_with = "key_word")]
    pub mode: UsernsMode,
    /// The first host uid/gid of the pool the sandboxes' ranges come from
    /// (default 2^31, far above any real user or the usual
    /// `/etc/subuid` ranges). A multiple of 65536.
    pub range_start: u32,
    /// How many host ids the pool holds (a multiple of 65536: one slot of
    /// 65536 per sandbox; default 2^30, 16384 sandboxes).
    pub range_count: u32,
}

impl Default for UsernsConfig {
    fn default() -> Self {
        UsernsConfig {
            mode: UsernsMode::Auto,
            range_start: 1 << 31,
            range_count: 1 << 30,
        }
    }
}

impl UsernsConfig {
    /// Number of sandbox slots in the pool.
    pub fn slots(&self) -> u32 {
        self.range_count / USERNS_SLOT
    }

    /// Checks the range of host ids.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("userns: {m}")));
        if self.range_start < USERNS_SLOT || !self.range_start.is_multiple_of(USERNS_SLOT) {
            return bad(format!(
                "range_start {} must be a multiple of 65536 and at least 65536 (host ids below belong to real users)",
                self.range_start
            ));
        }
        if self.range_count < USERNS_SLOT || !self.range_count.is_multiple_of(USERNS_SLOT) {
            return bad(format!(
                "range_count {} must be a positive multiple of 65536 (one slot per sandbox)",
                self.range_count
            ));
        }
        // The last id must stay below 2^32 - 1 ((uid_t)-1 means "no id").
        if u64::from(self.range_start) + u64::from(self.range_count) > u64::from(u32::MAX) {
            return bad(format!(
                "range_start + range_count = {} exceeds the largest host id {}",
                u64::from(self.range_start) + u64::from(self.range_count),
                u32::MAX - 1
            ));
        }
        Ok(())
    }
}

/// The host ids of one sandbox: container ids `0..size` are host ids
/// `host..host + size` (uids and gids alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsernsRange {
    pub host: u32,
    pub size: u32,
}

impl UsernsRange {
    /// The host id of container id `id`.
    pub fn host_id(&self, id: u32) -> Option<u32> {
        (id < self.size).then(|| self.host + id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("[userns] mode = \"on\", but idmapped mounts do not work here: {0}")]
    Unsupported(String),
    #[error("every user namespace range of the pool is taken ({0} sandboxes); raise [userns] range_count")]
    Exhausted(u32),
}

/// The pool of ranges (only when user namespaces are on).
pub struct Pool {
    start: u32,
    slots: u32,
    /// Sandbox id -> the first host id of its range.
    taken: Mutex<HashMap<String, u32>>,
}

impl Pool {
    pub fn new(cfg: &UsernsConfig) -> Pool {
        Pool {
            start: cfg.range_start,
            slots: cfg.slots(),
            taken: Mutex::default(),
        }
    }

    fn taken(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lowest free range, now taken by `id` (a range `id` already
    /// holds is returned again).
    pub fn allocate(&self, id: &str) -> Result<UsernsRange, UsernsError> {
        let mut taken = self.taken();
        if let Some(&host) = taken.get(id) {
            return Ok(UsernsRange {
                host,
                size: USERNS_SLOT,
            });
        }
        let used: std::collections::HashSet<u32> = taken.values().copied().collect();
        let host = (0..self.slots)
            .map(|i| self.start + i * USERNS_SLOT)
            .find(|h| !used.contains(h))
            .ok_or(UsernsError::Exhausted(self.slots))?;
        taken.insert(id.to_string(), host);
        Ok(UsernsRange {
            host,
            size: USERNS_SLOT,
        })
    }

    /// Takes the range an adopted sandbox runs with (also one outside the
    /// pool, e.g. after a configuration change: it is held until the
    /// sandbox goes, and never handed out twice).
    pub fn adopt(&self, id: &str, range: &UsernsRange) {
        let mut taken = self.taken();
        if let Some((other, _)) = taken
            .iter()
            .find(|(o, h)| **h == range.host && o.as_str() != id)
        {
            warn!(sandbox_id = %id, other = %other, host = range.host, "two sandboxes record the same user namespace range");
        }
        taken.insert(id.to_string(), range.host);
    }

    /// The range `from` holds is now `to`'s (a claimed pool member).
    pub fn rename(&self, from: &str, to: &str) {
        let mut taken = self.taken();
        if let Some(host) = taken.remove(from) {
            taken.insert(to.to_string(), host);
        }
    }

    /// Gives back the range of `id`, if it holds one.
    pub fn release(&self, id: &str) {
        self.taken().remove(id);
    }

    /// The range `id` holds.
    pub fn get(&self, id: &str) -> Option<UsernsRange> {
        self.taken().get(id).map(|&host| UsernsRange {
            host,
            size: USERNS_SLOT,
        })
    }

    /// How many ranges are taken.
    pub fn in_use(&self) -> usize {
        self.taken().len()
    }
}

/// Gives `spec` a user namespace with `range`: a `user` entry first in
/// `linux.namespaces` (sandbox-init creates it first and the others from
/// inside it) and the same `linux.uidMappings` and `gidMappings`.
pub fn apply_to_spec(
    spec: &mut oci_spec::runtime::Spec,
    range: &UsernsRange,
) -> Result<(), String> {
    use oci_spec::runtime::{LinuxIdMappingBuilder, LinuxNamespaceBuilder, LinuxNamespaceType};
    let mut linux = spec
        .linux()
        .clone()
        .ok_or("the spec has no linux section")?;
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    namespaces.retain(|n| n.typ() != LinuxNamespaceType::User);
    namespaces.insert(
        0,
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::User)
            .build()
            .map_err(|e| e.to_string())?,
    );
    linux.set_namespaces(Some(namespaces));
    let map = LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(range.host)
        .size(range.size)
        .build()
        .map_err(|e| e.to_string())?;
    linux.set_uid_mappings(Some(vec![map]));
    linux.set_gid_mappings(Some(vec![map]));
    spec.set_linux(Some(linux));
    Ok(())
}

/// Decides at start-up whether sandboxes get user namespaces: `off` never;
/// `auto` and `on` run a probe mount of every path bound into sandboxes
/// from the host (`sandbox-init --probe-idmap`); `auto` falls back to no
/// user namespace when it fails (a warning says why), `on` refuses to
/// start.
pub fn decide(
    cfg: &UsernsConfig,
    init: &Path,
    paths: &[PathBuf],
) -> Result<Option<Pool>, UsernsError> {
    if cfg.mode == UsernsMode::Off {
        info!("user namespaces off ([userns] mode = \"off\"): every sandbox runs as host uid 1000");
        return Ok(None);
    }
    match probe(init, paths, cfg.range_start) {
        Ok(()) => {
            info!(
                range_start = cfg.range_start,
                slots = cfg.slots(),
                "user namespaces on: each sandbox runs under its own 65536 host ids, with idmapped user data and skills"
            );
            Ok(Some(Pool::new(cfg)))
        }
        Err(e) if cfg.mode == UsernsMode::On => Err(UsernsError::Unsupported(e)),
        Err(e) => {
            warn!(
                error = %e,
                "user namespaces OFF ([userns] mode = \"auto\" fell back): idmapped mounts do not work here, so every sandbox runs as host uid 1000 and tenants share its per-user kernel limits; set [userns] mode = \"on\" to refuse to start instead"
            );
            Ok(None)
        }
    }
}

/// Runs the launcher's probe; the error names the path that failed.
pub fn probe(init: &Path, paths: &[PathBuf], base: u32) -> Result<(), String> {
    let mut cmd = std::process::Command::new(init);
    cmd.env_clear()
        .envs(sandbox_abi::failpoint::launcher_env())
        .arg("--probe-base")
        .arg(base.to_string());
    for p in paths {
        cmd.arg("--probe-idmap").arg(p);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", init.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(if msg.is_empty() {
            format!("{} --probe-idmap failed ({})", init.display(), out.status)
        } else {
            msg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{load_toml, Config};

    #[test]
    fn the_spec_gets_a_user_namespace_first_and_one_map_line() {
        use oci_spec::runtime::LinuxNamespaceType;
        let mut spec =
            super::super::bundle::parse_base(super::super::bundle::BASE_SPEC, "base").unwrap();
        let r = UsernsRange {
            host: 1 << 31,
            size: USERNS_SLOT,
        };
        apply_to_spec(&mut spec, &r).unwrap();
        apply_to_spec(&mut spec, &r).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        let ns = linux.namespaces().as_ref().unwrap();
        assert_eq!(ns[0].typ(), LinuxNamespaceType::User);
        assert_eq!(
            ns.iter()
                .filter(|n| n.typ() == LinuxNamespaceType::User)
                .count(),
            1
        );
        for maps in [linux.uid_mappings(), linux.gid_mappings()] {
            let m = maps.as_ref().unwrap();
            assert_eq!(m.len(), 1);
            assert_eq!(
                (m[0].container_id(), m[0].host_id(), m[0].size()),
                (0, 1 << 31, 65536)
            );
        }
    }

    #[test]
    fn ranges_are_disjoint_reused_and_adopted() {
        let cfg = UsernsConfig {
            mode: UsernsMode::On,
            range_start: 1 << 31,
            range_count: 3 * USERNS_SLOT,
        };
        let p = Pool::new(&cfg);
        let a = p.allocate("a").unwrap();
        let b = p.allocate("b").unwrap();
        assert_eq!(a.host, 1 << 31);
        assert_eq!(b.host, (1 << 31) + USERNS_SLOT);
        assert_eq!(p.allocate("a").unwrap(), a);
        assert_eq!(a.host_id(1000), Some((1 << 31) + 1000));
        assert_eq!(a.host_id(USERNS_SLOT), None);
        // An adopted range is never handed out again.
        p.adopt(
            "c",
            &UsernsRange {
                host: (1 << 31) + 2 * USERNS_SLOT,
                size: USERNS_SLOT,
            },
        );
        assert!(matches!(p.allocate("d"), Err(UsernsError::Exhausted(3))));
        p.release("a");
        assert_eq!(p.allocate("d").unwrap().host, 1 << 31);
        assert_eq!(p.in_use(), 3);
        assert_eq!(p.get("b"), Some(b));
    }

    #[test]
    fn userns_section_and_env() {
        let toml = "[userns]\nmode = \"on\"\nrange_start = 131072\nrange_count = 196608\n";
        let c = load_toml(toml, &[]).unwrap();
        assert_eq!(c.userns.mode, UsernsMode::On);
        assert_eq!(c.userns.slots(), 3);
        c.validate().unwrap();
        let c = load_toml(
            toml,
            &[
                ("SANDBOXD_USERNS", "off"),
                ("SANDBOXD_USERNS_RANGE_START", "262144"),
                ("SANDBOXD_USERNS_RANGE_COUNT", "65536"),
            ],
        )
        .unwrap();
        assert_eq!(c.userns.mode, UsernsMode::Off);
        assert_eq!((c.userns.range_start, c.userns.slots()), (262144, 1));
        assert!(load_toml(toml, &[("SANDBOXD_USERNS", "maybe")]).is_err());
        let toml = "[userns]\nmode = \"maybe\"\n";
        let e = load_toml(toml, &[]).unwrap_err().to_string();
        assert!(
            e.contains("userns.mode \"maybe\" is not auto, on or off"),
            "{e}"
        );
        assert_eq!(UsernsMode::On.to_string(), "on");
        let d = Config::default();
        assert_eq!(d.userns.mode, UsernsMode::Auto);
        assert_eq!((d.userns.range_start, d.userns.slots()), (1 << 31, 16384));
        for (start, count) in [
            (1000, 65536),
            (0, 65536),
            (131072, 1000),
            (131072, 0),
            (u32::MAX - 65535, 65536),
        ] {
            let mut c = Config::default();
            c.userns.range_start = start;
            c.userns.range_count = count;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("userns"), "{e}");
        }
    }
}
