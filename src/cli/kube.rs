//! `sandboxd kube ...`: the Kubernetes backend's commands.
//!
//! - `render`: prints, as YAML, every object a create of the given
//!   identity submits (Pod, Secret, NetworkPolicy, Service, in that order),
//!   built by the create's own [`spec::build_objects`] from the same config
//!   and environment as the daemon, offline. The Pod UID and the
//!   credential, which only exist at create time, are placeholders; like
//!   `sandboxd bundle`, the node env file is not read.
//! - `prepare`: the init step of every sandbox Pod ([`prepare`]).
//! - `migrate-ownership`: the one-time ownership migration ([`migrate`]).

use std::path::PathBuf;

use anyhow::bail;
use clap::Subcommand;

use crate::backend::kube::{migrate, prepare, spec, SpecConfig};
use crate::config::{Config, ProcessEnv};
use crate::model::{CreateRequest, SandboxSpec};

/// The owner UID `render` prints where a create has the Pod's real UID.
pub const RENDER_POD_UID: &str = "00000000-0000-0000-0000-000000000000";
/// The credential `render` prints where a create has a fresh random one.
pub const RENDER_CREDENTIAL: &str =
    "rendered-placeholder-a-create-makes-256-random-bits-per-incarnation";

#[derive(Debug, Subcommand)]
pub enum KubeCmd {
    /// Print every object a create would submit, as YAML (offline).
    Render(RenderArgs),
    /// The init step of sandbox Pods: install the agent, prepare user dirs.
    Prepare(prepare::PrepareArgs),
    /// One-time: give pre-existing user data to 1000:1000 (run as a Job).
    MigrateOwnership(migrate::MigrateArgs),
    /// Write the embedded seccomp profile as DIR/default.json for the
    /// kubelet (the node installer DaemonSet); with --every-seconds, keep
    /// it there.
    InstallSeccompProfile(InstallArgs),
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// The directory below the kubelet's seccomp root
    /// (`/var/lib/kubelet/seccomp/sandboxd` on the node).
    #[arg(long)]
    pub dir: PathBuf,
    /// Re-check (and rewrite when it differs) this often, forever.
    #[arg(long)]
    pub every_seconds: Option<u64>,
}

/// Writes the profile unless the file already holds it; true if written.
pub fn install_seccomp_profile(dir: &std::path::Path) -> anyhow::Result<bool> {
    let want = crate::seccomp::DEFAULT_PROFILE.as_bytes();
    let path = dir.join("default.json");
    if std::fs::read(&path).is_ok_and(|have| have == want) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".default.json.tmp");
    std::fs::write(&tmp, want)?;
    std::fs::rename(&tmp, &path)?;
    Ok(true)
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    #[arg(long)]
    pub sandbox_id: String,
    #[arg(long)]
    pub uid: String,
    #[arg(long, default_value = "render")]
    pub thread_id: String,
    #[arg(long, conflicts_with = "ephemeral")]
    pub workdir_path: Option<String>,
    /// Ephemeral sandbox (`inherit_env=false`, no workdir).
    #[arg(long)]
    pub ephemeral: bool,
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(cmd: KubeCmd) -> anyhow::Result<i32> {
    match cmd {
        KubeCmd::Render(a) => {
            let cfg = Config::load(a.config.as_deref(), &ProcessEnv)?;
            cfg.validate()?;
            print!("{}", render(&a, &cfg)?);
            Ok(0)
        }
        KubeCmd::Prepare(a) => match prepare::run(&a) {
            Ok(()) => Ok(0),
            Err(e) => {
                eprintln!("sandboxd kube prepare: {e}");
                Ok(e.exit_code())
            }
        },
        KubeCmd::InstallSeccompProfile(a) => loop {
            if install_seccomp_profile(&a.dir)? {
                println!("installed {}", a.dir.join("default.json").display());
            }
            match a.every_seconds {
                Some(s) => std::thread::sleep(std::time::Duration::from_secs(s.max(1))),
                None => return Ok(0),
            }
        },
        KubeCmd::MigrateOwnership(a) => {
            for root in &a.roots {
                let o = migrate::migrate_root(root)?;
                if o.ran {
                    println!(
                        "{}: {} entries given to 1000:1000 ({} on other filesystems skipped); marker {} made",
                        root.display(),
                        o.changed,
                        o.other_fs,
                        migrate::MARKER
                    );
                } else {
                    println!(
                        "{}: already migrated ({} exists)",
                        root.display(),
                        migrate::MARKER
                    );
                }
            }
            Ok(0)
        }
    }
}

/// The create request the arguments stand for.
fn request(a: &RenderArgs) -> anyhow::Result<CreateRequest> {
    Ok(serde_json::from_value(serde_json::json!({
        "sandbox_id": a.sandbox_id,
        "thread_id": a.thread_id,
        "uid": a.uid,
        "workdir_path": a.workdir_path,
        "inherit_env": !a.ephemeral,
    }))?)
}

/// The YAML stream of every object, in create order.
pub fn render(a: &RenderArgs, cfg: &Config) -> anyhow::Result<String> {
    if a.ephemeral && a.workdir_path.is_some() {
        bail!("--ephemeral and --workdir-path exclude each other");
    }
    let c = SpecConfig::from_config(cfg)?;
    let spec = SandboxSpec::from_request(request(a)?, &Default::default(), &cfg.limits)?;
    let o = spec::build_objects(&spec, RENDER_POD_UID, RENDER_CREDENTIAL, &c);
    let mut docs = vec![
        serde_norway::to_string(&o.pod)?,
        serde_norway::to_string(&o.secret)?,
    ];
    if let Some(np) = &o.network_policy {
        docs.push(serde_norway::to_string(np)?);
    }
    docs.push(serde_norway::to_string(&o.service)?);
    Ok(docs.join("---\n"))
}
