//! The bundle builder: a sandbox's OCI runtime spec (`config.json`), made
//! with `oci-spec` from the base spec in `oci/base.json` plus the sandbox's
//! identity, and the bundle directory (rootfs skeleton, generated `/etc`
//! files). `sandbox-init` reads this file and nothing else; `runc` can run
//! it too.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxSeccomp, Mount, MountBuilder, Spec};
use sandbox_abi::request::ResourceLimits;

use super::NativeConfig;
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
    #[error("{path} already exists: a bundle is written only into a new directory")]
    Exists { path: PathBuf },
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

/// (source, destination) pairs of paths.
pub type PathPairs = Vec<(PathBuf, PathBuf)>;

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
    /// The host's `/etc/...` entries are not among them: they are copied
    /// into the prepared `/etc` ([`super::etc`]).
    pub rootfs_binds: Vec<(PathBuf, PathBuf)>,
    /// The `/etc/...` entries of `[native] rootfs_binds` found on this
    /// host: (source, path below `/etc`), copied into the prepared `/etc`.
    pub etc_entries: Vec<(PathBuf, PathBuf)>,
    /// The userland brings its own `/etc` (an image): the shared generated
    /// files are bound over its files one by one instead of binding the
    /// prepared `/etc` directory.
    pub own_etc: bool,
    /// Cover the host's `/usr/local` (under a bound `/usr`) with an empty
    /// read-only tmpfs (`[native] expose_usr_local = false`, the default).
    pub hide_usr_local: bool,
    /// Symlinks made at the top of the bundle's rootfs skeleton (name,
    /// target): merged-/usr's `bin -> usr/bin` and the like, the host's
    /// ([`HostLayout::host_root_links`]) or an image's.
    pub root_links: Vec<(String, PathBuf)>,
    /// Whether this host enforces the base spec's device allow-list (the
    /// v1 devices cgroup, or on v2 the daemon's BPF device program). When
    /// it does not (v2 with a kernel that refused the program), bundles
    /// carry no `linux.resources.devices`, so the spec never promises what
    /// the runtime does not do.
    pub device_rules_enforced: bool,
    pub container_port: u16,
    pub limits: ResourceLimits,
    /// The agent's `--exec-cap-seconds` ([`Config::agent_exec_cap_seconds`](crate::config::Config::agent_exec_cap_seconds)).
    pub exec_cap_seconds: f64,
}

impl HostLayout {
    /// Resolves the configured read-only rootfs binds: paths missing on
    /// this host are skipped; trusted symlinks (e.g. `/etc/localtime`) are
    /// resolved here so the launcher can refuse every symlink it meets.
    /// Returns the binds and, apart, the entries below `/etc` (source, path
    /// below `/etc`), which go into the prepared `/etc` instead.
    pub fn resolve_binds(native: &NativeConfig) -> (PathPairs, PathPairs) {
        let mut binds = Vec::new();
        let mut etc = Vec::new();
        for p in &native.rootfs_binds {
            let dest = PathBuf::from(p);
            let Ok(src) = std::fs::canonicalize(&dest) else {
                continue;
            };
            match dest.strip_prefix("/etc") {
                Ok(rel) if !rel.as_os_str().is_empty() => etc.push((src, rel.to_path_buf())),
                _ => binds.push((src, dest)),
            }
        }
        (binds, etc)
    }

    /// Merged-/usr hosts: the top-level program directories that are
    /// symlinks into `/usr` on this host.
    pub fn host_root_links() -> Vec<(String, PathBuf)> {
        [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("lib32", "usr/lib32"),
            ("libx32", "usr/libx32"),
        ]
        .into_iter()
        .filter(|(_, target)| Path::new("/").join(target).exists())
        .map(|(link, target)| (link.to_string(), PathBuf::from(target)))
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

/// Builds the spec of one sandbox. `files_dir` holds its own files
/// (`hosts`, `hostname`, the command environment), `etc_dir` the prepared
/// `/etc` of its network mode ([`super::etc`]).
#[allow(clippy::too_many_arguments)]
pub fn build_spec(
    base: &Spec,
    spec: &SandboxSpec,
    generation: &str,
    host: &HostLayout,
    files_dir: &Path,
    etc_dir: &Path,
    cgroups_path: Option<&Path>,
    seccomp: Option<&LinuxSeccomp>,
) -> Result<Spec, BundleError> {
    let mut out = base.clone();
    let identity: &Identity = &spec.identity;

    // Mounts: the base table (tmpfs sizes from the node limits), the
    // read-only host binds of the rootfs profile, the generated /etc files,
    // user data and skills, the agent.
    // The rootfs binds come first, so the base table's mounts (tmpfs
    // `/tmp` and `/home/gem`, `/dev`, `/proc`) land on top of an image's
    // directories rather than under them.
    let mut mounts: Vec<Mount> = Vec::new();
    for (src, dest) in &host.rootfs_binds {
        mounts.push(mount(
            &dest.to_string_lossy(),
            "bind",
            src,
            &["rbind", "ro", "nosuid", "nodev"],
        )?);
    }
    let mut table: Vec<Mount> = base.mounts().clone().unwrap_or_default();
    for m in table.iter_mut() {
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
    mounts.extend(table);
    // What an operator installed by hand under /usr/local is not part of
    // the sandbox's userland: an empty read-only tmpfs covers it.
    let usr_bound = host
        .rootfs_binds
        .iter()
        .any(|(_, d)| d == Path::new("/usr"));
    if host.hide_usr_local && usr_bound {
        mounts.push(mount(
            "/usr/local",
            "tmpfs",
            Path::new("tmpfs"),
            &["ro", "nosuid", "nodev", "noexec", "size=4k", "mode=755"],
        )?);
    }
    mounts.extend(etc_mounts(host.own_etc, files_dir, etc_dir)?);
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
    // The command environment file, bound read-only where the agent reads
    // it at start.
    mounts.push(mount(
        GUEST.command_env_path,
        "bind",
        &files_dir.join(COMMAND_ENV_FILE),
        &["bind", "ro", "nosuid", "nodev", "noexec"],
    )?);

    out.set_mounts(Some(mounts));

    // Process: the agent as PID 1 with a fixed environment (the base
    // spec's plus the sandbox user's identity, never the request's: that
    // one reaches commands only, through the command environment file), the
    // workdir as cwd.
    let mut process = base
        .process()
        .clone()
        .ok_or(BundleError::Incomplete("process"))?;
    process.set_args(Some(vec![
        GUEST.agent_path.to_string(),
        "--listen".to_string(),
        format!("127.0.0.1:{}", host.container_port),
        "--command-env".to_string(),
        GUEST.command_env_path.to_string(),
        "--exec-cap-seconds".to_string(),
        host.exec_cap_seconds.to_string(),
    ]));
    let fixed: BTreeMap<String, String> = GUEST
        .fixed_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    process.set_env(Some(overlay_env(process.env().as_deref(), &fixed)));
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
    // The limits come from the builder that also limits the cgroup; the
    // rest of the base's resources (the device allow-list) is kept.
    let mut base_resources = linux.resources().clone().unwrap_or_default();
    if !host.device_rules_enforced {
        base_resources.set_devices(None);
    }
    let resources = crate::cgroups::oci_resources(base_resources, &spec.resources, true)
        .map_err(|e| BundleError::Build(e.to_string()))?;
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

/// The `/etc` mounts: the prepared directory bound read-only at `/etc`
/// (the host's userland) or its shared files bound over an image's own,
/// then the sandbox's `hosts` and `hostname` over either.
fn etc_mounts(own_etc: bool, files_dir: &Path, etc_dir: &Path) -> Result<Vec<Mount>, BundleError> {
    let bind_ro = |dest: &str, src: &Path| {
        mount(
            dest,
            "bind",
            src,
            &["bind", "ro", "nosuid", "nodev", "noexec"],
        )
    };
    let mut out = Vec::new();
    if own_etc {
        for name in super::etc::SHARED_FILES {
            out.push(bind_ro(&format!("/etc/{name}"), &etc_dir.join(name))?);
        }
    } else {
        out.push(bind_ro("/etc", etc_dir)?);
    }
    for name in super::etc::PER_SANDBOX_FILES {
        out.push(bind_ro(&format!("/etc/{name}"), &files_dir.join(name))?);
    }
    Ok(out)
}

/// `/etc/resolv.conf` of a sandbox with loopback only.
pub const RESOLV_NO_NETWORK: &str = "# sandboxd: no network\n";

/// The generated `/etc` files that are the same for every sandbox (user
/// `gem` 1000) of a network mode (`resolv_conf`): in the prepared `/etc`.
pub fn shared_files(resolv_conf: &str) -> Vec<(&'static str, String)> {
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
        ("resolv.conf", resolv_conf.to_string()),
    ]
}

/// The generated `/etc` files that name the sandbox: in its bundle's
/// `files/`, bound over the prepared `/etc`'s mount points.
pub fn sandbox_files(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
        ("hostname", format!("{hostname}\n")),
    ]
}

/// The file in `files/` holding the command environment.
pub const COMMAND_ENV_FILE: &str = "command-env";

/// `base` (`KEY=VALUE` entries) with every variable of `over` replacing
/// one of the same name.
fn overlay_env(base: Option<&[String]>, over: &BTreeMap<String, String>) -> Vec<String> {
    let mut env: Vec<String> = base.unwrap_or_default().to_vec();
    env.retain(|kv| !over.contains_key(kv.split('=').next().unwrap_or("")));
    env.extend(over.iter().map(|(k, v)| format!("{k}={v}")));
    env
}

/// The environment of every command of the sandbox: the base spec's
/// `process.env` with the sandbox's merged env (fixed, node-global and
/// request variables) over it.
pub fn command_env(base: &Spec, spec: &SandboxSpec) -> Vec<String> {
    let base_env = base.process().as_ref().and_then(|p| p.env().clone());
    overlay_env(base_env.as_deref(), &spec.env)
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

/// Asks the launcher to make the root's skeleton ([`SKELETON_DIRS`] and
/// `root_links`) in a tmpfs of the sandbox's own
/// ([`sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION`]); the bundle's
/// `rootfs/` is then left empty.
pub fn annotate_root_skeleton(
    spec: &mut Spec,
    root_links: &[(String, PathBuf)],
) -> Result<(), BundleError> {
    let skeleton = sandbox_abi::handoff::RootSkeleton {
        dirs: SKELETON_DIRS.iter().map(|d| d.to_string()).collect(),
        links: root_links
            .iter()
            .map(|(n, t)| (n.clone(), t.display().to_string()))
            .collect(),
    };
    let value = serde_json::to_string(&skeleton).map_err(|e| BundleError::Build(e.to_string()))?;
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    annotations.insert(
        sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION.to_string(),
        value,
    );
    spec.set_annotations(Some(annotations));
    Ok(())
}

/// Writes the bundle: `config.json`, `rootfs/` skeleton, `files/` and,
/// when `etc_in_bundle` is given (`sandboxd bundle`, no daemon's prepared
/// `/etc`), that content as `etc/`. When
/// `seccomp_verbatim` is given it replaces `linux.seccomp`, so the profile
/// lands in `config.json` exactly as written (with its rationale comments,
/// which OCI consumers ignore).
///
/// `dir` must not exist: it is created exclusively (mode 0700), and every
/// file and directory below it is made relative to its fd with
/// `O_NOFOLLOW | O_EXCL` (`mkdirat`, `openat`, `symlinkat`), so this code,
/// which runs as root, never follows a symlink someone planted, whether at
/// `dir` itself or below it (`sandboxd bundle --out DIR` writes wherever
/// its caller says).
pub fn write_bundle(
    dir: &Path,
    spec: &Spec,
    command_env: &[String],
    seccomp_verbatim: Option<&serde_json::Value>,
    etc_in_bundle: Option<&[super::etc::Entry]>,
    root_links: Option<&[(String, PathBuf)]>,
) -> Result<(), BundleError> {
    let root = create_exclusive_dir(dir)?;
    if let Some(entries) = etc_in_bundle {
        let etc = make_dir(&root, dir, "etc")?;
        super::etc::write_entries(&etc, &dir.join("etc"), entries)?;
    }
    let rootfs = make_dir(&root, dir, "rootfs")?;
    let rootfs_path = dir.join("rootfs");
    // None: the launcher makes the skeleton (annotate_root_skeleton).
    let (skeleton, root_links): (&[&str], &[(String, PathBuf)]) = match root_links {
        Some(links) => (&SKELETON_DIRS, links),
        None => (&[], &[]),
    };
    for &d in skeleton {
        // `var/tmp`: its parent is listed (and made) before it.
        let (parent, name) = match d.rsplit_once('/') {
            Some((p, n)) => (Some(open_dir(&rootfs, &rootfs_path, p)?), n),
            None => (None, d),
        };
        make_dir(parent.as_ref().unwrap_or(&rootfs), &rootfs_path, name)?;
    }
    // Merged-/usr: the top-level program directories are symlinks (the
    // host's, or an image's top-level symlinks).
    for (link, target) in root_links {
        rustix::fs::symlinkat(target, &rootfs, link.as_str())
            .map_err(|e| write_err(&rootfs_path.join(link), e))?;
    }
    let files = make_dir(&root, dir, "files")?;
    let files_path = dir.join("files");
    let hostname = spec.hostname().clone().unwrap_or_else(|| "sandbox".into());
    for (name, content) in sandbox_files(&hostname) {
        // Bound over /etc inside, read by the sandbox user.
        write_new_file(&files, &files_path, name, content.as_bytes(), 0o644)?;
    }
    // NUL-terminated entries: values may hold newlines. Read by the agent
    // (uid 1000), hence 0644; the directory above is the daemon's 0700.
    let mut bytes = Vec::new();
    for kv in command_env {
        bytes.extend_from_slice(kv.as_bytes());
        bytes.push(0);
    }
    write_new_file(&files, &files_path, COMMAND_ENV_FILE, &bytes, 0o644)?;
    let mut value = serde_json::to_value(spec).map_err(|e| BundleError::Build(e.to_string()))?;
    if let (Some(profile), Some(linux)) = (seccomp_verbatim, value.get_mut("linux")) {
        linux["seccomp"] = profile.clone();
    }
    let json = serde_json::to_vec_pretty(&value).map_err(|e| BundleError::Build(e.to_string()))?;
    // Holds the sandbox's environment: the daemon's only.
    write_new_file(&root, dir, "config.json", &json, 0o600)
}

fn write_err(path: &Path, e: rustix::io::Errno) -> BundleError {
    BundleError::Write {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Creates `dir` (which must not exist; a symlink there counts as existing)
/// with mode 0700 and opens it without following a symlink.
pub(super) fn create_exclusive_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, BundleError> {
    use rustix::fs::{Mode, OFlags};
    let name = dir.file_name().ok_or_else(|| BundleError::Exists {
        path: dir.to_path_buf(),
    })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent_fd = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| write_err(parent, e))?;
    match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => {}
        Err(rustix::io::Errno::EXIST) => {
            return Err(BundleError::Exists {
                path: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(write_err(dir, e)),
    }
    let fd = rustix::fs::openat(
        &parent_fd,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| write_err(dir, e))?;
    // mkdirat's mode went through the umask; make it exactly 0700.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| write_err(dir, e))?;
    Ok(fd)
}

/// `mkdirat` + open of `name` below `parent` (shown as `shown/name`),
/// refusing an existing entry or a symlink.
fn make_dir(
    parent: &std::os::fd::OwnedFd,
    shown: &Path,
    name: &str,
) -> Result<std::os::fd::OwnedFd, BundleError> {
    use rustix::fs::Mode;
    let path = shown.join(name);
    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755))
        .map_err(|e| write_err(&path, e))?;
    open_dir(parent, shown, name)
}

/// `mkdirat` of `name` below `parent` with exactly `mode` (not through
/// the umask), refusing an existing entry.
pub(super) fn make_dir_mode(
    parent: &std::os::fd::OwnedFd,
    shown: &Path,
    name: &str,
    mode: u32,
) -> Result<(), BundleError> {
    use rustix::fs::{Mode, OFlags};
    let path = shown.join(name);
    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
        .map_err(|e| write_err(&path, e))?;
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| write_err(&path, e))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| write_err(&path, e))
}

/// Opens the existing directory `rel` below `parent`, no symlink followed.
pub(super) fn open_dir(
    parent: &std::os::fd::OwnedFd,
    shown: &Path,
    rel: &str,
) -> Result<std::os::fd::OwnedFd, BundleError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    rustix::fs::openat2(
        parent,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|e| write_err(&shown.join(rel), e))
}

/// Writes a new file `name` below `parent` (`O_CREAT | O_EXCL | O_NOFOLLOW`)
/// with exactly `mode`.
pub(super) fn write_new_file(
    parent: &std::os::fd::OwnedFd,
    shown: &Path,
    name: &str,
    content: &[u8],
    mode: u32,
) -> Result<(), BundleError> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write;
    let path = shown.join(name);
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(|e| write_err(&path, e))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| write_err(&path, e))?;
    std::fs::File::from(fd)
        .write_all(content)
        .map_err(|source| BundleError::Write { path, source })
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
            etc_entries: vec![],
            own_etc: false,
            hide_usr_local: true,
            root_links: HostLayout::host_root_links(),
            device_rules_enforced: true,
            container_port: 8080,
            limits: ResourceLimits::default(),
            exec_cap_seconds: 5.4,
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
                image: None,
            },
            env,
            resources: Resources {
                memory_mb: 256,
                cpus: 0.5,
                pids: 64,
            },
            network: None,
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

    /// The spec of an ephemeral sandbox without cgroup path or seccomp.
    fn ephemeral_spec(base: &Spec, host: &HostLayout) -> Spec {
        build_spec(
            base,
            &sspec(StorageMode::Ephemeral, None),
            "g1",
            host,
            Path::new("/b/files"),
            Path::new("/state/etc/x"),
            None,
            None,
        )
        .unwrap()
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
            Path::new("/state/etc/x"),
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
        // The request's env (PATH=/custom here) reaches commands only; the
        // agent's own env is the base spec's plus the fixed identity.
        let commands = command_env(&base, &sspec(StorageMode::Persistent, Some("p/q")));
        assert!(commands.contains(&"PATH=/custom".to_string()));
        assert_eq!(
            commands.iter().filter(|e| e.starts_with("PATH=")).count(),
            1
        );
        let env = p.env().as_ref().unwrap();
        assert!(!env.contains(&"PATH=/custom".to_string()), "{env:?}");
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert!(env.contains(&"HOME=/home/gem".to_string()));
        let args = p.args().as_ref().unwrap();
        assert_eq!(
            args[3..],
            [
                "--command-env",
                GUEST.command_env_path,
                "--exec-cap-seconds",
                "5.4"
            ]
        );
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
        let s = ephemeral_spec(&base, &host());
        assert!(!dests(&s).contains(&GUEST.skills.to_string()));
        for m in s.mounts().as_ref().unwrap() {
            let src = m.source().as_ref().map(|p| p.to_string_lossy().to_string());
            assert!(!src.unwrap_or_default().starts_with("/data/"), "{m:?}");
        }
        assert_eq!(s.process().as_ref().unwrap().cwd(), Path::new(GUEST.home));
    }

    /// On a host that cannot enforce the device allow-list (v2 without the
    /// BPF device program) the bundle does not carry it: the spec promises nothing the runtime
    /// does not do.
    #[test]
    fn device_rules_only_where_enforced() {
        let base = load_base(None).unwrap();
        let devices = |enforced: bool| {
            let mut h = host();
            h.device_rules_enforced = enforced;
            let s = ephemeral_spec(&base, &h);
            let r = s.linux().as_ref().unwrap().resources().clone().unwrap();
            (r.devices().clone().map(|d| d.len()), r.pids().is_some())
        };
        let (with, pids) = devices(true);
        assert!(with.is_some_and(|n| n > 0) && pids);
        let (without, pids) = devices(false);
        assert_eq!(without, None);
        assert!(pids, "the limits stay");
    }

    #[test]
    fn limits_are_the_cgroup_builders_over_the_base_devices() {
        let base = load_base(None).unwrap();
        let s = ephemeral_spec(&base, &host());
        let r = serde_json::to_value(s.linux().as_ref().unwrap().resources()).unwrap();
        let mut expected =
            serde_json::to_value(base.linux().as_ref().unwrap().resources()).unwrap();
        expected["memory"] = serde_json::json!({"limit": 268435456, "swap": 268435456});
        expected["pids"] = serde_json::json!({"limit": 64});
        expected["cpu"] = serde_json::json!({"quota": 50000, "period": 100000});
        assert_eq!(r, expected);
        assert!(!r["devices"].as_array().unwrap().is_empty());
    }

    /// `/etc` mounts with their sources.
    fn etc_mounts_of(s: &Spec) -> Vec<(String, String)> {
        s.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m.destination().to_string_lossy().to_string(),
                    m.source().as_ref().unwrap().to_string_lossy().to_string(),
                )
            })
            .filter(|(d, _)| d.starts_with("/etc"))
            .collect()
    }

    /// The host's userland: one read-only bind of the prepared `/etc`, then
    /// the sandbox's own `hosts` and `hostname`; an image keeps its `/etc`
    /// and gets the shared files over its own, at the mount points every
    /// image is unpacked with.
    #[test]
    fn etc_is_one_prepared_bind_plus_the_sandbox_names() {
        let base = load_base(None).unwrap();
        let pair = |d: &str, s: &str| (d.to_string(), s.to_string());
        let s = ephemeral_spec(&base, &host());
        assert_eq!(
            etc_mounts_of(&s),
            [
                pair("/etc", "/state/etc/x"),
                pair("/etc/hosts", "/b/files/hosts"),
                pair("/etc/hostname", "/b/files/hostname"),
            ]
        );
        let etc = s
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination() == Path::new("/etc"))
            .unwrap();
        assert!(etc.options().as_ref().unwrap().contains(&"ro".to_string()));
        let mut image = host();
        image.own_etc = true;
        let s = ephemeral_spec(&base, &image);
        let got = etc_mounts_of(&s);
        assert_eq!(
            got,
            [
                pair("/etc/passwd", "/state/etc/x/passwd"),
                pair("/etc/group", "/state/etc/x/group"),
                pair("/etc/resolv.conf", "/state/etc/x/resolv.conf"),
                pair("/etc/hosts", "/b/files/hosts"),
                pair("/etc/hostname", "/b/files/hostname"),
            ]
        );
        #[cfg(feature = "images")]
        {
            let points = crate::images::mount_points(&base);
            for (dest, _) in &got {
                assert!(
                    points.iter().any(|p| &p.path == dest && p.file),
                    "{dest} is not an image mount point"
                );
            }
        }
    }

    #[test]
    fn bad_base_spec_is_an_error() {
        assert!(parse_base("{", "x").is_err());
    }
}
