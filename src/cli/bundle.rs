//! `sandboxd bundle`: writes the OCI bundle (config.json, rootfs skeleton,
//! generated files) that a create of the given identity would use, without
//! starting anything. Host directories are neither checked nor created.

use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::backend::native::bundle::{self, HostLayout};
use crate::backend::native::Seccomp;
use crate::config::{Config, ProcessEnv};
use crate::lifecycle::request::build_spec;
use crate::model::{new_generation, CreateRequest};

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
    /// Output directory: created with mode 0700; must not exist (nothing is
    /// written through a symlink or into an existing directory).
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
    // Checked again, atomically, when the directory is made (mkdir, not
    // "exists?"); this only gives the clear error before any work.
    if args.out.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: a bundle is written only into a new directory",
            args.out.display()
        );
    }
    let req: CreateRequest = serde_json::from_value(serde_json::json!({
        "sandbox_id": args.sandbox_id,
        "thread_id": args.thread_id,
        "uid": args.uid,
        "workdir_path": args.workdir_path,
        "inherit_env": !args.ephemeral,
    }))?;
    let spec = build_spec(req, &Default::default(), &cfg.limits)?;
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
    let env = bundle::command_env(&base, &spec);
    if let Err(e) = bundle::write_bundle(&out, &oci, &env, Some(&seccomp.verbatim)) {
        // Remove what we made (never what existed: then nothing was made).
        if !matches!(e, bundle::BundleError::Exists { .. }) {
            let _ = std::fs::remove_dir_all(&out);
        }
        return Err(e.into());
    }
    println!("{}", out.join("config.json").display());
    Ok(())
}
