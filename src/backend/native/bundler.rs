//! What every bundle of this node is built from, resolved once from the
//! configuration: the host layout, the base spec, the seccomp profile and
//! the cgroup parent. The daemon makes its [`Bundler`] at start-up
//! ([`HostPaths::Prepare`]) and writes each create's bundle with
//! [`Bundler::write_bundle_to`]; `sandboxd bundle` makes one the same way
//! without creating or checking anything on the host
//! ([`HostPaths::Untouched`]) and writes with the same function.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxSeccomp, Spec};
use tracing::info;

use super::bundle::{self, HostLayout};
use super::NativeError;
use crate::cgroups::CgroupParent;
use crate::config::Config;
use crate::model::SandboxSpec;

/// The seccomp profile every bundle carries: its OCI form for the spec and
/// the verbatim JSON written into `config.json`.
#[derive(Clone)]
pub struct Seccomp {
    pub oci: LinuxSeccomp,
    pub verbatim: serde_json::Value,
}

impl Seccomp {
    /// Loads and compiles the configured (or embedded) profile; any error
    /// stops the daemon's start-up (never a sandbox without its filter).
    pub fn load(path: Option<&Path>) -> Result<Seccomp, NativeError> {
        Ok(Self::load_compiled(path)?.0)
    }

    /// [`load`](Self::load), also returning the compiled filters.
    fn load_compiled(
        path: Option<&Path>,
    ) -> Result<(Seccomp, sandbox_seccomp::CompiledFilters), NativeError> {
        let (profile, _raw, filters) = crate::seccomp::load_and_compile(path)?;
        info!(
            profile = %profile.source,
            instructions = ?filters.instruction_counts(),
            "seccomp profile compiled"
        );
        Ok((
            Seccomp {
                oci: profile.to_oci()?,
                verbatim: profile.to_oci_value(),
            },
            filters,
        ))
    }
}

/// What resolving the host paths may do to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPaths {
    /// The daemon: the user-data root (with `shared/`) and the skills root
    /// are created if missing, and every path must resolve (a missing
    /// agent is an error).
    Prepare,
    /// `sandboxd bundle`: nothing is created or checked; a path that
    /// resolves is canonicalized, any other is used as configured.
    Untouched,
}

/// Builds and writes the bundles of this node.
pub struct Bundler {
    host: HostLayout,
    base: Spec,
    seccomp: Seccomp,
    cgroup_parent: CgroupParent,
    /// The daemon's network mode (the default of a sandbox).
    network: crate::model::NetworkMode,
    /// Where each network mode's shared `/etc` comes from.
    etc: EtcSource,
    /// The compiled seccomp filters the launcher installs, written once at
    /// start (the daemon), else compiled by the launcher from `config.json`.
    seccomp_bpf: Option<PathBuf>,
    /// The daemon's bundles: the root's skeleton is made by `sandbox-init`
    /// in a tmpfs of the sandbox's own (an annotation lists it), so a
    /// create makes a score fewer inodes on the state directory's disk;
    /// `sandboxd bundle` (for `runc`) writes it into `rootfs/`.
    root_in_launcher: bool,
}

/// The shared `/etc` content of the bundles ([`super::etc`]).
enum EtcSource {
    /// The daemon's prepared directories (egress, none).
    Prepared { egress: PathBuf, none: PathBuf },
    /// `sandboxd bundle`: the content, written into each bundle's `etc/`.
    InBundle {
        egress: Vec<super::etc::Entry>,
        none: Vec<super::etc::Entry>,
    },
}

/// The file (in the state directory) the compiled seccomp filters are
/// written to at start, for every launch of this daemon.
pub const SECCOMP_BPF_FILE: &str = "seccomp.bpf";

impl Bundler {
    /// Loads the seccomp profile (first: nothing else matters without it),
    /// resolves the host layout, loads the base spec and checks the cgroup
    /// parent.
    ///
    /// The daemon ([`HostPaths::Prepare`]) also writes, under the state
    /// directory, the compiled seccomp filters ([`SECCOMP_BPF_FILE`]) and
    /// the prepared `/etc` of each network mode ([`super::etc`]).
    pub fn new(cfg: &Config, paths: HostPaths) -> Result<Bundler, NativeError> {
        let (seccomp, filters) = Seccomp::load_compiled(cfg.native.seccomp_profile.as_deref())?;
        let host = host_layout(cfg, paths)?;
        let base = bundle::load_base(cfg.native.base_spec.as_deref())?;
        let cgroup_parent = CgroupParent::new(&cfg.native.cgroup_parent)?;
        let resolv_egress = {
            let (ns, search) = super::net::dns::host_resolvers(&cfg.network.resolv_conf);
            super::net::dns::render(&ns, &search)
        };
        let egress = super::etc::content(&host.etc_entries, &resolv_egress);
        let none = super::etc::content(&host.etc_entries, bundle::RESOLV_NO_NETWORK);
        let (etc, seccomp_bpf) = match paths {
            HostPaths::Untouched => (EtcSource::InBundle { egress, none }, None),
            HostPaths::Prepare => {
                let base = cfg.state_dir.join("etc");
                let egress = super::etc::prepare(&base, &egress)?;
                let none = super::etc::prepare(&base, &none)?;
                if no_sandbox_dirs(&cfg.state_dir) {
                    super::etc::remove_others(&base, &[&egress, &none]);
                }
                let bpf = cfg.state_dir.join(SECCOMP_BPF_FILE);
                write_seccomp_bpf(&bpf, &filters)?;
                (EtcSource::Prepared { egress, none }, Some(bpf))
            }
        };
        Ok(Bundler {
            host,
            base,
            seccomp,
            cgroup_parent,
            network: cfg.network.mode,
            etc,
            seccomp_bpf,
            root_in_launcher: matches!(paths, HostPaths::Prepare),
        })
    }

    /// The compiled seccomp filters the launcher is to install (see
    /// `sandbox-init --seccomp-bpf`), when the daemon wrote them.
    pub fn seccomp_bpf(&self) -> Option<&Path> {
        self.seccomp_bpf.as_deref()
    }

    /// The prepared `/etc` directories (bound into sandboxes: the daemon
    /// checks that they can be idmapped).
    pub fn prepared_etc(&self) -> Vec<PathBuf> {
        match &self.etc {
            EtcSource::Prepared { egress, none } => vec![egress.clone(), none.clone()],
            EtcSource::InBundle { .. } => Vec::new(),
        }
    }

    /// The base spec every bundle starts from.
    pub fn base(&self) -> &Spec {
        &self.base
    }

    /// Whether the device allow-list is enforced on this host (see
    /// [`HostLayout::device_rules_enforced`]).
    pub fn set_device_rules_enforced(&mut self, enforced: bool) {
        self.host.device_rules_enforced = enforced;
    }

    pub fn host(&self) -> &HostLayout {
        &self.host
    }

    /// Writes the bundle of `spec` at `generation` into `dir`: the one
    /// function both a create and `sandboxd bundle` write bundles with.
    pub fn write_bundle_to(
        &self,
        spec: &SandboxSpec,
        generation: &str,
        dir: &Path,
    ) -> Result<Spec, NativeError> {
        self.write_bundle_with(spec, generation, dir, None, None, None)
    }

    /// The environment of every command of `spec`'s sandbox running
    /// `image` (its config's env under the request's), as a bundle of it
    /// writes it (a warm-pool claim hands it to the agent).
    pub fn command_env(
        &self,
        spec: &SandboxSpec,
        image: Option<&crate::images::ResolvedImage>,
    ) -> Result<Vec<String>, NativeError> {
        let (base, _) = super::rootfs::select(&self.base, &self.host, image)
            .map_err(NativeError::ImageUnavailable)?;
        Ok(bundle::command_env(&base, spec))
    }

    /// [`write_bundle_to`](Self::write_bundle_to) with the sandbox's
    /// userland: the host's (`None`) or an image's (see [`super::rootfs`]),
    /// and a user namespace of the host ids `userns` when given (a create,
    /// when `[userns]` is on).
    pub fn write_bundle_with(
        &self,
        spec: &SandboxSpec,
        generation: &str,
        dir: &Path,
        image: Option<&crate::images::ResolvedImage>,
        userns: Option<&super::userns::UsernsRange>,
        pool_slot: Option<&Path>,
    ) -> Result<Spec, NativeError> {
        let (base, host) = super::rootfs::select(&self.base, &self.host, image)
            .map_err(NativeError::ImageUnavailable)?;
        let cgroup_path = self.cgroup_parent.relative_path(&spec.sandbox_id);
        let egress = spec.network.unwrap_or(self.network) == crate::model::NetworkMode::Egress;
        let (etc_dir, etc_in_bundle) = match &self.etc {
            EtcSource::Prepared { egress: e, none: n } => {
                (if egress { e } else { n }.clone(), None)
            }
            EtcSource::InBundle { egress: e, none: n } => {
                (dir.join("etc"), Some(if egress { e } else { n }.as_slice()))
            }
        };
        let mut oci = bundle::build_spec(
            &base,
            spec,
            generation,
            &host,
            &dir.join("files"),
            &etc_dir,
            Some(&cgroup_path),
            Some(&self.seccomp.oci),
        )?;
        if let Some(i) = image {
            super::rootfs::check_mount_points(i, &oci).map_err(NativeError::ImageUnavailable)?;
        }
        if let Some(slot) = pool_slot {
            super::pool::member_spec(&mut oci, slot)
                .map_err(|e| NativeError::Bundle(bundle::BundleError::Build(e)))?;
        }
        if let Some(range) = userns {
            super::userns::apply_to_spec(&mut oci, range)
                .map_err(|e| NativeError::Bundle(bundle::BundleError::Build(e)))?;
        }
        let env = bundle::command_env(&base, spec);
        if self.root_in_launcher {
            bundle::annotate_root_skeleton(&mut oci, &host.root_links)?;
        }
        bundle::write_bundle(
            dir,
            &oci,
            &env,
            Some(&self.seccomp.verbatim),
            etc_in_bundle,
            (!self.root_in_launcher).then_some(host.root_links.as_slice()),
        )?;
        Ok(oci)
    }
}

/// The host layout from the configuration (see [`HostPaths`]).
fn host_layout(cfg: &Config, paths: HostPaths) -> Result<HostLayout, NativeError> {
    let agent = match &cfg.native.agent_path {
        Some(p) => p.clone(),
        None => sibling_binary("sandbox-agent", paths)?,
    };
    let (user_data_root, skills_root, agent_path) = match paths {
        HostPaths::Prepare => (
            prepare_root(&cfg.user_data_root, Some("shared"))?,
            prepare_root(&cfg.skills_root, None)?,
            resolve(&agent)?,
        ),
        HostPaths::Untouched => (
            resolve_or_keep(&cfg.user_data_root),
            resolve_or_keep(&cfg.skills_root),
            resolve_or_keep(&agent),
        ),
    };
    let (rootfs_binds, etc_entries) = HostLayout::resolve_binds(&cfg.native);
    Ok(HostLayout {
        user_data_root,
        skills_root,
        agent_path,
        rootfs_binds,
        etc_entries,
        own_etc: false,
        hide_usr_local: !cfg.native.expose_usr_local,
        root_links: HostLayout::host_root_links(),
        // Corrected by the daemon once it knows the cgroup layout
        // (`Bundler::set_device_rules_enforced`); `sandboxd bundle` writes
        // the base spec's rules as they are.
        device_rules_enforced: true,
        container_port: cfg.container_port,
        limits: cfg.limits,
        exec_cap_seconds: cfg.agent_exec_cap_seconds(),
    })
}

/// Where the Debian package installs `sandbox-init` and `sandbox-agent`
/// (`sandboxd` itself goes to `/usr/bin`).
pub const LIBEXEC_DIR: &str = "/usr/libexec/sandboxd";

/// A binary shipped with `sandboxd`: next to the running `sandboxd` (a
/// build tree, `/usr/local/bin`), else in [`LIBEXEC_DIR`] (the package);
/// with [`HostPaths::Prepare`] it must be in one of them.
pub(super) fn sibling_binary(name: &'static str, paths: HostPaths) -> Result<PathBuf, NativeError> {
    let path = std::env::current_exe()
        .map_err(NativeError::CurrentExe)?
        .with_file_name(name);
    let libexec = Path::new(LIBEXEC_DIR).join(name);
    if path.is_file() {
        Ok(path)
    } else if libexec.is_file() {
        Ok(libexec)
    } else if paths == HostPaths::Untouched {
        Ok(path)
    } else {
        Err(NativeError::MissingBinary { name, path })
    }
}

/// `canonicalize`, naming the path in its error.
fn resolve(path: &Path) -> Result<PathBuf, NativeError> {
    std::fs::canonicalize(path).map_err(|source| NativeError::Resolve {
        path: path.to_path_buf(),
        source,
    })
}

fn resolve_or_keep(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Creates (if needed) and canonicalizes an operator-configured root.
fn prepare_root(path: &Path, sub: Option<&str>) -> Result<PathBuf, NativeError> {
    let full = sub
        .map(|s| path.join(s))
        .unwrap_or_else(|| path.to_path_buf());
    std::fs::create_dir_all(&full)
        .map_err(|source| NativeError::CreateRoot { path: full, source })?;
    resolve(path)
}

/// Whether the state directory holds no sandbox directory (then no
/// sandbox, adopted or not, can use an earlier prepared `/etc`).
fn no_sandbox_dirs(state_dir: &Path) -> bool {
    match std::fs::read_dir(state_dir.join("sandboxes")) {
        Ok(mut rd) => rd.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Writes the compiled filters for the launcher (temporary file, rename:
/// a launch never reads a partial file). Root's only (0600).
fn write_seccomp_bpf(
    path: &Path,
    filters: &sandbox_seccomp::CompiledFilters,
) -> Result<(), NativeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| {
        NativeError::Bundle(bundle::BundleError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(&filters.to_bytes()).map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}
