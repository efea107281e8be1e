//! `sandboxd bundle`: writes the OCI bundle (config.json, rootfs skeleton,
//! generated files) that a create of the given identity would use, without
//! starting anything. Host directories are neither checked nor created.

use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::backend::native::bundle::{self, HostLayout};
use crate::backend::native::Seccomp;
use crate::config::{Config, ProcessEnv};
use crate::model::{new_generation, CreateRequest, SandboxSpec};

#[derive(Debug, clap::Args)]
pub struct BundleArgs {
    #[arg(long)]
    pub sandbox_id: String,
    #[arg(long)]
    pub uid: String,
    #[arg(long, default_value = "bundle")]
    pub thread_id: String,
    #[arg(long)]
    pub workdir_path: Option<String>,
    /// Ephemeral sandbox (`inherit_env=false`, no workdir).
    #[arg(long)]
    pub ephemeral: bool,
    /// Output directory (created; must not exist or be empty).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(args: BundleArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref(), &ProcessEnv)?;
    cfg.validate()?;
    if args.ephemeral && args.workdir_path.is_some() {
        bail!("--ephemeral and --workdir-path exclude each other");
    }
    if args.out.exists()
        && std::fs::read_dir(&args.out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!("{} exists and is not empty", args.out.display());
    }
    let req: CreateRequest = serde_json::from_value(serde_json::json!({
        "sandbox_id": args.sandbox_id,
        "thread_id": args.thread_id,
        "uid": args.uid,
        "workdir_path": args.workdir_path,
        "inherit_env": !args.ephemeral,
    }))?;
    let spec = SandboxSpec::from_request(req, &Default::default(), &cfg.limits.resources())?;
    let agent = match &cfg.native.agent_path {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("sandbox-agent"))
            .context("cannot locate sandbox-agent")?,
    };
    let canon = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
    let host = HostLayout {
        user_data_root: canon(&cfg.user_data_root),
        skills_root: canon(&cfg.skills_root),
        agent_path: canon(&agent),
        rootfs_binds: HostLayout::resolve_binds(&cfg.native),
        container_port: cfg.container_port,
        limits: cfg.limits.clone(),
    };
    let base = bundle::load_base(cfg.native.base_spec.as_deref())?;
    let seccomp = Seccomp::load(cfg.native.seccomp_profile.as_deref())?;
    let out = std::path::absolute(&args.out)?;
    let cgroup_path = PathBuf::from(format!(
        "/{}/{}",
        cfg.native.cgroup_parent.trim_matches('/'),
        spec.sandbox_id
    ));
    let oci = bundle::build_spec(
        &base,
        &spec,
        &new_generation(),
        &host,
        &out.join("files"),
        Some(&cgroup_path),
        Some(&seccomp.oci),
    )?;
    bundle::write_bundle(&out, &oci, Some(&seccomp.verbatim))?;
    println!("{}", out.join("config.json").display());
    Ok(())
}
