//! The bundle builder: a sandbox's OCI runtime spec (`config.json`), made
//! with `oci-spec` from the base spec in `oci/base.json` plus the sandbox's
//! identity, and the bundle directory (rootfs skeleton, generated `/etc`
//! files). `sandbox-init` reads this file and nothing else; `runc` can run
//! it too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxSeccomp, Mount, MountBuilder, Spec,
};

use crate::config::{Limits, NativeConfig};
use crate::model::{Identity, SandboxSpec, StorageMode};
use sandbox_abi::layout::{self, GUEST};

/// The base spec every bundle starts from (overridable by config).
pub const BASE_SPEC: &str = include_str!("../../../oci/base.json");

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read base spec {path}: {source}")]
    ReadBase {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("base spec {path} is not a valid OCI runtime spec: {message}")]
    ParseBase { path: String, message: String },
    #[error("base spec lacks {0}")]
    Incomplete(&'static str),
    #[error("cannot build spec: {0}")]
    Build(String),
    #[error("cannot write bundle {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Parses a base spec.
pub fn parse_base(text: &str, origin: &str) -> Result<Spec, BundleError> {
    serde_json::from_str(text).map_err(|e| BundleError::ParseBase {
        path: origin.to_string(),
        message: e.to_string(),
    })
}

/// Loads the base spec: the configured file or the embedded one.
pub fn load_base(path: Option<&Path>) -> Result<Spec, BundleError> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| BundleError::ReadBase {
                path: p.to_path_buf(),
                source,
            })?;
            parse_base(&text, &p.display().to_string())
        }
        None => parse_base(BASE_SPEC, "embedded oci/base.json"),
    }
}

/// Host paths and settings the builder needs (resolved once at start-up).
#[derive(Debug, Clone)]
pub struct HostLayout {
    /// Canonical user-data root (holds `shared/<uid>/workspace`).
    pub user_data_root: PathBuf,
    /// Canonical skills root (holds `<uid>/`).
    pub skills_root: PathBuf,
    /// The `sandbox-agent` binary on the host.
    pub agent_path: PathBuf,
    /// Host paths bound read-only into the rootfs: (source, destination).
    pub rootfs_binds: Vec<(PathBuf, PathBuf)>,
    pub container_port: u16,
    pub limits: Limits,
}

impl HostLayout {
    /// Resolves the configured read-only rootfs binds: paths missing on
    /// this host are skipped; trusted symlinks (e.g. `/etc/localtime`) are
    /// resolved here so the launcher can refuse every symlink it meets.
    pub fn resolve_binds(native: &NativeConfig) -> Vec<(PathBuf, PathBuf)> {
        native
            .rootfs_binds
            .iter()
            .filter_map(|p| {
                let dest = PathBuf::from(p);
                std::fs::canonicalize(&dest).ok().map(|src| (src, dest))
            })
            .collect()
    }

    pub fn workspace(&self, uid: &str) -> PathBuf {
        self.user_data_root.join(layout::workspace_rel(uid))
    }

    pub fn skills(&self, uid: &str) -> PathBuf {
        self.skills_root.join(layout::native_skills_rel(uid))
    }
}

/// The hostname of a sandbox: derived from its id, DNS-safe.
pub fn hostname_for(id: &str) -> String {
    let mut h: String = format!("sbx-{id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    h.truncate(63);
    h
}

fn mount(dest: &str, typ: &str, source: &Path, options: &[&str]) -> Result<Mount, BundleError> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(|e| BundleError::Build(e.to_string()))
}

fn set_size(options: &mut Vec<String>, mb: u64) {
    options.retain(|o| !o.starts_with("size="));
    options.push(format!("size={mb}m"));
}

/// Builds the spec of one sandbox.
pub fn build_spec(
    base: &Spec,
    spec: &SandboxSpec,
    generation: &str,
    host: &HostLayout,
    files_dir: &Path,
    cgroups_path: Option<&Path>,
    seccomp: Option<&LinuxSeccomp>,
) -> Result<Spec, BundleError> {
    let mut out = base.clone();
    let identity: &Identity = &spec.identity;

    // Mounts: the base table (tmpfs sizes from the node limits), the
    // read-only host binds of the rootfs profile, the generated /etc files,
    // user data and skills, the agent.
    let mut mounts: Vec<Mount> = base.mounts().clone().unwrap_or_default();
    for m in mounts.iter_mut() {
        let dest = m.destination().to_string_lossy().to_string();
        let size = match dest.as_str() {
            "/tmp" => Some(host.limits.tmp_size_mb),
            h if h == GUEST.home => Some(host.limits.home_size_mb),
            _ => None,
        };
        if let Some(mb) = size {
            let mut opts = m.options().clone().unwrap_or_default();
            set_size(&mut opts, mb);
            m.set_options(Some(opts));
        }
    }
    for (src, dest) in &host.rootfs_binds {
        mounts.push(mount(
            &dest.to_string_lossy(),
            "bind",
            src,
            &["rbind", "ro", "nosuid", "nodev"],
        )?);
    }
    for name in ["passwd", "group", "hosts", "resolv.conf", "hostname"] {
        mounts.push(mount(
            &format!("/etc/{name}"),
            "bind",
            &files_dir.join(name),
            &["bind", "ro", "nosuid", "nodev", "noexec"],
        )?);
    }
    match identity.storage {
        StorageMode::Persistent => {
            mounts.push(mount(
                GUEST.user_data,
                "bind",
                &host.workspace(&identity.uid),
                &["bind", "rw", "nosuid", "nodev"],
            )?);
            mounts.push(mount(
                GUEST.skills,
                "bind",
                &host.skills(&identity.uid),
                &["bind", "ro", "nosuid", "nodev"],
            )?);
        }
        StorageMode::Ephemeral => {
            let size = format!("size={}m", host.limits.home_size_mb);
            mounts.push(mount(
                GUEST.user_data,
                "tmpfs",
                Path::new("tmpfs"),
                &["nosuid", "nodev", "mode=700", "uid=1000", "gid=1000", &size],
            )?);
        }
    }
    mounts.push(mount(
        GUEST.agent_path,
        "bind",
        &host.agent_path,
        &["bind", "ro", "nosuid", "nodev"],
    )?);
    out.set_mounts(Some(mounts));

    // Process: the agent as PID 1, the merged env, the workdir as cwd.
    let mut process = base
        .process()
        .clone()
        .ok_or(BundleError::Incomplete("process"))?;
    process.set_args(Some(vec![
        GUEST.agent_path.to_string(),
        "--listen".to_string(),
        format!("127.0.0.1:{}", host.container_port),
    ]));
    let mut env: Vec<String> = process.env().clone().unwrap_or_default();
    env.retain(|kv| {
        let k = kv.split('=').next().unwrap_or("");
        !spec.env.contains_key(k)
    });
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    process.set_env(Some(env));
    let cwd = match &identity.workdir_path {
        Some(w) => PathBuf::from(GUEST.user_data).join(w),
        None => PathBuf::from(GUEST.home),
    };
    process.set_cwd(cwd);
    out.set_process(Some(process));
    out.set_hostname(Some(hostname_for(&spec.sandbox_id)));

    // Linux: cgroup, limits, seccomp.
    let mut linux = base
        .linux()
        .clone()
        .ok_or(BundleError::Incomplete("linux"))?;
    linux.set_cgroups_path(cgroups_path.map(Path::to_path_buf));
    let mut resources = linux.resources().clone().unwrap_or_default();
    let mem = (spec.resources.memory_mb * 1024 * 1024) as i64;
    let build = |e: oci_spec::OciSpecError| BundleError::Build(e.to_string());
    resources.set_memory(Some(
        LinuxMemoryBuilder::default()
            .limit(mem)
            .swap(mem)
            .build()
            .map_err(build)?,
    ));
    resources.set_pids(Some(
        LinuxPidsBuilder::default()
            .limit(spec.resources.pids as i64)
            .build()
            .map_err(build)?,
    ));
    resources.set_cpu(Some(
        LinuxCpuBuilder::default()
            .quota((spec.resources.cpus * 100_000.0).round() as i64)
            .period(100_000u64)
            .build()
            .map_err(build)?,
    ));
    linux.set_resources(Some(resources));
    if let Some(s) = seccomp {
        linux.set_seccomp(Some(s.clone()));
    }
    out.set_linux(Some(linux));

    let mut ann: HashMap<String, String> = base.annotations().clone().unwrap_or_default();
    ann.extend(sandbox_abi::labels::annotations(
        &spec.sandbox_id,
        Some(generation),
        identity,
    ));
    out.set_annotations(Some(ann));
    Ok(out)
}

/// The generated files bound over `/etc/...` (user `gem` 1000).
pub fn generated_files(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            "root:x:0:0:root:/root:/usr/sbin/nologin\n\
             gem:x:1000:1000:gem:/home/gem:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                .to_string(),
        ),
        (
            "group",
            "root:x:0:\ngem:x:1000:\nnogroup:x:65534:\n".to_string(),
        ),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
        // Loopback only: no resolver is reachable from a sandbox.
        ("resolv.conf", "# sandboxd: no network\n".to_string()),
        ("hostname", format!("{hostname}\n")),
    ]
}

/// Directories of the rootfs skeleton (mount points of the base table and
/// the host binds are created by the launcher as needed).
const SKELETON_DIRS: [&str; 12] = [
    "usr",
    "etc",
    "proc",
    "sys",
    "dev",
    "tmp",
    "home",
    "run",
    "var",
    "var/tmp",
    "root",
    ".sandboxd",
];

/// Writes the bundle: `config.json`, `rootfs/` skeleton, `files/`. When
/// `seccomp_verbatim` is given it replaces `linux.seccomp`, so the profile
/// lands in `config.json` exactly as written (with its rationale comments,
/// which OCI consumers ignore).
pub fn write_bundle(
    dir: &Path,
    spec: &Spec,
    seccomp_verbatim: Option<&serde_json::Value>,
) -> Result<(), BundleError> {
    let w = |path: &Path, r: std::io::Result<()>| {
        r.map_err(|source| BundleError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    let rootfs = dir.join("rootfs");
    for d in SKELETON_DIRS {
        let p = rootfs.join(d);
        w(&p, std::fs::create_dir_all(&p))?;
    }
    // Merged-/usr hosts: the top-level program directories are symlinks.
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("lib32", "usr/lib32"),
        ("libx32", "usr/libx32"),
    ] {
        let p = rootfs.join(link);
        if Path::new("/").join(target).exists() && !p.exists() {
            w(&p, std::os::unix::fs::symlink(target, &p))?;
        }
    }
    let files = dir.join("files");
    w(&files, std::fs::create_dir_all(&files))?;
    let hostname = spec.hostname().clone().unwrap_or_else(|| "sandbox".into());
    for (name, content) in generated_files(&hostname) {
        let p = files.join(name);
        w(&p, std::fs::write(&p, content))?;
    }
    let cfg = dir.join("config.json");
    let mut value = serde_json::to_value(spec).map_err(|e| BundleError::Build(e.to_string()))?;
    if let (Some(profile), Some(linux)) = (seccomp_verbatim, value.get_mut("linux")) {
        linux["seccomp"] = profile.clone();
    }
    let json = serde_json::to_vec_pretty(&value).map_err(|e| BundleError::Build(e.to_string()))?;
    w(&cfg, std::fs::write(&cfg, json))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Resources, SandboxSpec};
    use std::collections::BTreeMap;

    fn host() -> HostLayout {
        HostLayout {
            user_data_root: "/data/ud".into(),
            skills_root: "/data/sk".into(),
            agent_path: "/opt/sandbox-agent".into(),
            rootfs_binds: vec![("/usr".into(), "/usr".into())],
            container_port: 8080,
            limits: Limits::default(),
        }
    }

    fn sspec(storage: StorageMode, workdir: Option<&str>) -> SandboxSpec {
        let mut env = BTreeMap::new();
        env.insert("HOME".to_string(), "/home/gem".to_string());
        env.insert("PATH".to_string(), "/custom".to_string());
        SandboxSpec {
            sandbox_id: "Ab_1".into(),
            identity: Identity {
                thread_id: "t".into(),
                uid: "u1".into(),
                workdir_path: workdir.map(String::from),
                storage,
            },
            env,
            resources: Resources {
                memory_mb: 256,
                cpus: 0.5,
                pids: 64,
            },
        }
    }

    fn dests(s: &Spec) -> Vec<String> {
        s.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.destination().to_string_lossy().to_string())
            .collect()
    }

    #[test]
    fn persistent_with_workdir() {
        let base = load_base(None).unwrap();
        let s = build_spec(
            &base,
            &sspec(StorageMode::Persistent, Some("p/q")),
            "g1",
            &host(),
            Path::new("/b/files"),
            Some(Path::new("/sandboxd/Ab_1")),
            None,
        )
        .unwrap();
        let d = dests(&s);
        let ud = d.iter().position(|x| x == GUEST.user_data).unwrap();
        let home = d.iter().position(|x| x == GUEST.home).unwrap();
        assert!(home < ud, "home tmpfs must come before user-data");
        assert!(d.contains(&GUEST.skills.to_string()));
        let m = &s.mounts().as_ref().unwrap()[ud];
        assert_eq!(
            m.source().as_ref().unwrap(),
            Path::new("/data/ud/shared/u1/workspace")
        );
        let p = s.process().as_ref().unwrap();
        assert_eq!(p.cwd(), Path::new("/home/gem/user-data/p/q"));
        assert_eq!(p.user().uid(), 1000);
        assert_eq!(p.no_new_privileges(), Some(true));
        // Not set by default: runc refuses a negative score on hosts that
        // withhold CAP_SYS_RESOURCE (see docs/operations.md, OOM kills).
        assert_eq!(p.oom_score_adj(), None);
        let env = p.env().as_ref().unwrap();
        assert!(env.contains(&"PATH=/custom".to_string()));
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert_eq!(s.hostname().as_deref(), Some("sbx-ab-1"));
        let linux = s.linux().as_ref().unwrap();
        let r = linux.resources().as_ref().unwrap();
        assert_eq!(
            r.memory().as_ref().unwrap().limit(),
            Some(256 * 1024 * 1024)
        );
        assert_eq!(r.pids().as_ref().unwrap().limit(), 64);
        assert_eq!(r.cpu().as_ref().unwrap().quota(), Some(50_000));
        let caps = p.capabilities().as_ref().unwrap();
        assert!(caps.bounding().as_ref().unwrap().is_empty());
    }

    #[test]
    fn ephemeral_has_no_host_user_paths() {
        let base = load_base(None).unwrap();
        let s = build_spec(
            &base,
            &sspec(StorageMode::Ephemeral, None),
            "g1",
            &host(),
            Path::new("/b/files"),
            None,
            None,
        )
        .unwrap();
        assert!(!dests(&s).contains(&GUEST.skills.to_string()));
        for m in s.mounts().as_ref().unwrap() {
            let src = m.source().as_ref().map(|p| p.to_string_lossy().to_string());
            assert!(!src.unwrap_or_default().starts_with("/data/"), "{m:?}");
        }
        assert_eq!(s.process().as_ref().unwrap().cwd(), Path::new(GUEST.home));
    }

    #[test]
    fn bad_base_spec_is_an_error() {
        assert!(parse_base("{", "x").is_err());
    }
}
