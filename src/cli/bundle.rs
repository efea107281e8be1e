//! `sandboxd bundle`: writes the OCI bundle (config.json, rootfs skeleton,
//! generated files) that a create of the given identity would use, without
//! starting anything. It builds what a create builds: the spec through the
//! `SandboxSpec::from_request` and the bundle through the native backend's
//! [`Bundler`], resolved as the daemon resolves it, except that host
//! directories are neither checked nor created ([`HostPaths::Untouched`])
//! and the node env file is not read.

use std::path::PathBuf;

use anyhow::bail;

use crate::backend::native::bundle::BundleError;
use crate::backend::native::{Bundler, HostPaths, NativeError};
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
    /// The create's `"image"` (default: the node's `[images] default`);
    /// taken from the image store, never pulled.
    #[arg(long)]
    pub image: Option<String>,
}

pub fn run(args: BundleArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref(), &ProcessEnv)?;
    cfg.validate()?;
    println!("{}", write(&args, &cfg)?.display());
    Ok(())
}

/// The create request the arguments stand for.
fn request(args: &BundleArgs) -> anyhow::Result<CreateRequest> {
    Ok(serde_json::from_value(serde_json::json!({
        "sandbox_id": args.sandbox_id,
        "thread_id": args.thread_id,
        "uid": args.uid,
        "workdir_path": args.workdir_path,
        "inherit_env": !args.ephemeral,
        "image": args.image.as_deref().map(crate::images::normalize).transpose().map_err(anyhow::Error::msg)?,
    }))?)
}

/// Writes the bundle into `args.out`; returns the path of `config.json`.
fn write(args: &BundleArgs, cfg: &Config) -> anyhow::Result<PathBuf> {
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
    // No node env file: what it holds is the node's, not the bundle's.
    let spec = SandboxSpec::from_request(request(args)?, &Default::default(), &cfg.limits)?;
    let bundler = Bundler::new(cfg, HostPaths::Untouched)?;
    // The userland a create would get: the create's image, else the
    // node's default image, else the host's.
    let image = match spec
        .identity
        .image
        .as_deref()
        .or(cfg.images.default.as_deref())
    {
        Some(r) => Some(crate::images::resolve_stored(cfg, r)?),
        None => None,
    };
    let out = std::path::absolute(&args.out)?;
    if let Err(e) =
        bundler.write_bundle_with(&spec, &new_generation(), &out, image.as_ref(), None, None)
    {
        // Remove what we made (never what existed: then nothing was made).
        if !matches!(e, NativeError::Bundle(BundleError::Exists { .. })) {
            let _ = std::fs::remove_dir_all(&out);
        }
        return Err(e.into());
    }
    Ok(out.join("config.json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_abi::labels;
    use std::path::Path;

    fn args(out: &Path, workdir: Option<&str>, ephemeral: bool) -> BundleArgs {
        BundleArgs {
            sandbox_id: "b1".into(),
            uid: "u1".into(),
            thread_id: "t1".into(),
            workdir_path: workdir.map(String::from),
            ephemeral,
            out: out.to_path_buf(),
            config: None,
            image: None,
        }
    }

    /// A configuration over `root`, with an agent binary there.
    fn config(root: &Path) -> Config {
        let agent = root.join("sandbox-agent");
        std::fs::write(&agent, "").unwrap();
        let mut cfg = Config {
            user_data_root: root.join("user-data"),
            skills_root: root.join("skills"),
            state_dir: root.join("state"),
            ..Config::default()
        };
        cfg.native.agent_path = Some(agent);
        cfg.native.cgroup_parent = "/system.slice/sandboxd.service/sandboxes/".into();
        cfg
    }

    /// `config.json` without the generation, the one thing that differs
    /// between two bundles of the same sandbox.
    fn config_json(path: &Path) -> serde_json::Value {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let ann = v["annotations"].as_object_mut().unwrap();
        assert!(ann.remove(labels::GENERATION).is_some(), "no generation");
        v
    }

    /// Takes the source of the `/etc` mount (the shared `/etc`: the
    /// daemon's prepared directory, or the bundle's own `etc/`) out of `v`.
    fn take_etc_source(v: &mut serde_json::Value) -> PathBuf {
        let m = v["mounts"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|m| m["destination"] == "/etc")
            .expect("an /etc mount");
        PathBuf::from(m["source"].take().as_str().unwrap())
    }

    #[test]
    fn the_cli_writes_the_bundle_a_create_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(tmp.path());
        std::fs::create_dir_all(cfg.user_data_root.join("shared/u1/workspace/proj")).unwrap();
        std::fs::create_dir_all(cfg.skills_root.join("u1")).unwrap();
        let out = tmp.path().join("out");
        for (workdir, ephemeral) in [(Some("proj"), false), (None, false), (None, true)] {
            let a = args(&out, workdir, ephemeral);
            let mut cli = config_json(&write(&a, &cfg).unwrap());
            assert_eq!(take_etc_source(&mut cli), out.join("etc"));
            let passwd = std::fs::read_to_string(out.join("etc/passwd")).unwrap();
            assert!(passwd.contains("gem:x:1000:1000"), "{passwd}");
            assert!(
                out.join("rootfs/usr").is_dir(),
                "runc's bundle carries the skeleton"
            );
            assert!(
                !cfg.state_dir.exists(),
                "sandboxd bundle wrote into the state directory"
            );
            std::fs::remove_dir_all(&out).unwrap();
            // A create: the daemon's bundler (as NativeBackend::new makes
            // it), the lifecycle's spec, the function blocking_create calls.
            let spec =
                SandboxSpec::from_request(request(&a).unwrap(), &Default::default(), &cfg.limits)
                    .unwrap();
            Bundler::new(&cfg, HostPaths::Prepare)
                .unwrap()
                .write_bundle_to(&spec, &new_generation(), &out)
                .unwrap();
            let mut created = config_json(&out.join("config.json"));
            let prepared = take_etc_source(&mut created);
            // The launcher makes a create's root (in a tmpfs of its own).
            let skeleton = created["annotations"]
                .as_object_mut()
                .unwrap()
                .remove(sandbox_abi::handoff::ROOT_SKELETON_ANNOTATION)
                .expect("the skeleton annotation");
            assert!(
                skeleton.as_str().unwrap().contains("\"var/tmp\""),
                "{skeleton}"
            );
            assert!(
                std::fs::read_dir(out.join("rootfs"))
                    .unwrap()
                    .next()
                    .is_none(),
                "a create's rootfs/ is empty"
            );
            assert!(
                prepared.starts_with(cfg.state_dir.join("etc")),
                "{prepared:?}"
            );
            assert_eq!(
                std::fs::read_to_string(prepared.join("passwd")).unwrap(),
                passwd,
                "the same /etc content"
            );
            assert!(!out.join("etc").exists(), "a create's bundle has no etc/");
            std::fs::remove_dir_all(&out).unwrap();
            std::fs::remove_dir_all(&cfg.state_dir).unwrap();
            assert_eq!(cli, created, "workdir {workdir:?}, ephemeral {ephemeral}");
            assert_eq!(
                created["linux"]["cgroupsPath"],
                "/system.slice/sandboxd.service/sandboxes/b1"
            );
        }
    }

    #[test]
    fn the_cli_creates_and_checks_nothing_on_the_host() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = config(tmp.path());
        cfg.native.agent_path = Some(tmp.path().join("no-agent"));
        let out = tmp.path().join("out");
        let v = config_json(&write(&args(&out, Some("missing"), false), &cfg).unwrap());
        assert!(!cfg.user_data_root.exists());
        assert!(!cfg.skills_root.exists());
        let sources: Vec<&str> = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["source"].as_str())
            .collect();
        let workspace = cfg.user_data_root.join("shared/u1/workspace");
        assert!(
            sources.contains(&workspace.to_str().unwrap()),
            "{sources:?}"
        );
        assert!(sources.contains(&tmp.path().join("no-agent").to_str().unwrap()));
        // A bundle is never written over another.
        assert!(write(&args(&out, None, false), &cfg).is_err());
    }
}
