//! `sandboxd image pull|import|ls|rm|gc`: the native backend's image store
//! (`<state_dir>/images`, see `docs/images.md`), with the daemon's
//! configuration and environment (state dir, registries, auth). Safe while
//! the daemon serves: the store's locks order every writer, and `rm`/`gc`
//! never remove an image a sandbox's `state.json` names.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use sandbox_image::{Digest, Progress};

use crate::config::Config;
use crate::images::{image_users, Images};

/// Which node's configuration to use (as `ls`/`rm` do).
#[derive(Debug, clap::Args)]
pub struct Node {
    /// Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml when it exists).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The daemon's env file (default /etc/sandboxd/sandboxd.env when it exists).
    #[arg(long)]
    pub env_file: Option<PathBuf>,
    /// State directory holding the store (also SANDBOXD_STATE_DIR).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry into the store (verified).
    Pull {
        #[command(flatten)]
        node: Node,
        /// `[registry/]repository[:tag|@sha256:...]`
        reference: String,
    },
    /// Import an OCI image layout (directory or tar) or a `docker save` archive.
    Import {
        #[command(flatten)]
        node: Node,
        /// The layout directory, or the tar file.
        path: PathBuf,
        /// The reference to store it under (default: the name the archive carries).
        #[arg(long)]
        tag: Option<String>,
    },
    /// List the stored images: reference, digest, size.
    Ls {
        #[command(flatten)]
        node: Node,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove a reference (and its image when no other reference names it);
    /// refused while a sandbox uses the image.
    Rm {
        #[command(flatten)]
        node: Node,
        reference: String,
    },
    /// Remove images no reference names and blobs no image needs (never an
    /// image a sandbox uses).
    Gc {
        #[command(flatten)]
        node: Node,
    },
}

fn config(n: &Node) -> anyhow::Result<Config> {
    super::ops::node_config(
        n.config.as_deref(),
        n.env_file.as_deref(),
        n.state_dir.as_deref(),
    )
}

fn images(cfg: &Config) -> anyhow::Result<Images> {
    let base = crate::backend::native::bundle::load_base(cfg.native.base_spec.as_deref())?;
    Images::new(cfg, &base)
}

pub fn run(cmd: ImageCmd) -> anyhow::Result<i32> {
    match cmd {
        ImageCmd::Pull { node, reference } => {
            let cfg = config(&node)?;
            let images = images(&cfg)?;
            let r = sandbox_image::reference::normalize(&reference).map_err(anyhow::Error::msg)?;
            let progress = CliProgress::new();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let rec = rt
                .block_on(images.pull_now(&r, &progress))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("pulling {r}"))?;
            progress.clear();
            println!("{r} {} {}", rec.manifest, human(rec.size));
            Ok(0)
        }
        ImageCmd::Import { node, path, tag } => {
            let cfg = config(&node)?;
            let images = images(&cfg)?;
            let progress = CliProgress::new();
            let (rec, refs) = sandbox_image::import::import(
                images.store(),
                &path,
                tag.as_deref(),
                &images.commit_options(&progress),
            )
            .with_context(|| format!("importing {}", path.display()))?;
            progress.clear();
            for r in refs {
                println!("{r} {} {}", rec.manifest, human(rec.size));
            }
            Ok(0)
        }
        ImageCmd::Ls { node, json } => {
            let cfg = config(&node)?;
            let images = images(&cfg)?;
            let listed = images.store().list()?;
            if json {
                for l in &listed {
                    println!(
                        "{}",
                        serde_json::json!({
                            "reference": l.reference,
                            "digest": l.record.manifest,
                            "size": l.record.size,
                            "unpacked_bytes": l.record.unpacked_bytes,
                            "created_at": l.record.created_at,
                        })
                    );
                }
                return Ok(0);
            }
            println!("{:<60} {:<19} {:>10}", "REFERENCE", "DIGEST", "SIZE");
            for l in &listed {
                let d = l.record.manifest.get(..19).unwrap_or(&l.record.manifest);
                println!(
                    "{:<60} {:<19} {:>10}",
                    l.reference.as_deref().unwrap_or("<none>"),
                    d,
                    human(l.record.size)
                );
            }
            Ok(0)
        }
        ImageCmd::Rm { node, reference } => {
            let cfg = config(&node)?;
            let images = images(&cfg)?;
            let r = sandbox_image::reference::normalize(&reference).map_err(anyhow::Error::msg)?;
            let users = |d: &Digest| image_users(&cfg.state_dir, d);
            match images.store().remove(&r, &users)? {
                Some(d) => println!("removed {r} (image {d})"),
                None => {
                    println!("removed reference {r} (its image stays: another reference names it)")
                }
            }
            Ok(0)
        }
        ImageCmd::Gc { node } => {
            let cfg = config(&node)?;
            let images = images(&cfg)?;
            let users = |d: &Digest| image_users(&cfg.state_dir, d);
            let rep = images.store().gc(&users)?;
            for d in &rep.images {
                println!("removed image {d}");
            }
            for d in &rep.kept_in_use {
                println!("kept image {d}: a sandbox uses it");
            }
            println!("removed {} blob(s), {}", rep.blobs, human(rep.bytes));
            Ok(0)
        }
    }
}

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Per-blob progress: bars on a terminal (stderr), plain lines otherwise.
struct CliProgress {
    bars: Option<MultiProgress>,
    by_digest: Mutex<HashMap<Digest, ProgressBar>>,
}

impl CliProgress {
    fn new() -> CliProgress {
        CliProgress {
            bars: std::io::stderr().is_terminal().then(MultiProgress::new),
            by_digest: Mutex::new(HashMap::new()),
        }
    }

    fn clear(&self) {
        if let Some(m) = &self.bars {
            let _ = m.clear();
        }
    }
}

impl Progress for CliProgress {
    fn blob_start(&self, what: &str, d: &Digest, size: Option<u64>) {
        match &self.bars {
            Some(m) => {
                let pb = m.add(ProgressBar::new(size.unwrap_or(0)));
                pb.set_style(
                    ProgressStyle::with_template(
                        "{prefix:<20} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                pb.set_prefix(format!("{what} {}", d.short()));
                self.by_digest
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(d.clone(), pb);
            }
            None => eprintln!(
                "{what} {}: fetching{}",
                d.short(),
                size.map(|s| format!(" {}", human(s))).unwrap_or_default()
            ),
        }
    }

    fn blob_bytes(&self, d: &Digest, n: u64) {
        if let Some(pb) = self
            .by_digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(d)
        {
            pb.inc(n);
        }
    }

    fn blob_done(&self, d: &Digest, cached: bool) {
        let pb = self
            .by_digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(d);
        match pb {
            Some(pb) => pb.finish(),
            None if self.bars.is_none() => eprintln!(
                "{} {}",
                d.short(),
                if cached {
                    "already present"
                } else {
                    "verified"
                }
            ),
            None => {}
        }
    }

    fn unpack_layer(&self, index: usize, count: usize, d: &Digest) {
        let line = format!("unpacking layer {}/{count} {}", index + 1, d.short());
        match &self.bars {
            Some(m) => {
                let _ = m.println(line);
            }
            None => eprintln!("{line}"),
        }
    }
}
