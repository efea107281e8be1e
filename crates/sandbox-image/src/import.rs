//! Import without a registry: an OCI image layout (a directory or a tar of
//! one) or a `docker save` archive, with the same verification as a pull:
//! every blob is hashed while it is copied into the store and compared with
//! the digest (and size) that names it; layers against `rootfs.diff_ids`.
//!
//! A tar is read once: its regular files with a name a layout or an
//! archive can have (`index.json`, `oci-layout`, `manifest.json`,
//! `blobs/<alg>/<hex>`, `<id>.json`, `<id>/layer.tar`, ...) are copied to
//! the store's `tmp/`, everything else is ignored; nothing of it is ever
//! created outside the store.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{ImageIndex, ImageManifest};
use serde::Deserialize;
use tracing::info;

use crate::assemble::{CommitOptions, Writer};
use crate::digest::{Digest, HashingReader};
use crate::reference::normalize;
use crate::store::{io_err, ImageRecord, Store, StoreError};
use crate::VerifyError;

/// Largest JSON document (index, manifest, config) read into memory.
const MAX_JSON: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
}

impl From<VerifyError> for ImportError {
    fn from(e: VerifyError) -> Self {
        ImportError::Store(StoreError::Verify(e))
    }
}

/// The files of a layout or archive, by name.
struct Files {
    root: PathBuf,
    /// For a tar: name -> extracted temp file.
    extracted: Option<BTreeMap<String, PathBuf>>,
}

impl Files {
    /// Where file `name` of the layout or archive is. Names come from the
    /// archive's own JSON: only those a layout or archive can have are
    /// looked up (no `..`, nothing absolute), so none reaches outside it.
    fn path(&self, name: &str) -> Option<PathBuf> {
        let name = name.trim_start_matches("./");
        if !wanted(name) {
            return None;
        }
        match &self.extracted {
            Some(m) => m.get(name).cloned(),
            None => {
                let p = self.root.join(name);
                p.is_file().then_some(p)
            }
        }
    }

    fn open(&self, name: &str) -> Result<File, ImportError> {
        let p = self.path(name).ok_or_else(|| ImportError::Format {
            path: self.root.clone(),
            message: format!("{name} is missing"),
        })?;
        File::open(&p).map_err(|e| io_err("open", &p)(e).into())
    }

    fn read_json(&self, name: &str) -> Result<Vec<u8>, ImportError> {
        let mut buf = Vec::new();
        self.open(name)?
            .take(MAX_JSON + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_err("read", Path::new(name))(e))?;
        if buf.len() as u64 > MAX_JSON {
            return Err(self.bad(format!("{name} is over {MAX_JSON} bytes")));
        }
        Ok(buf)
    }

    fn bad(&self, message: String) -> ImportError {
        ImportError::Format {
            path: self.root.clone(),
            message,
        }
    }
}

/// Whether a tar member is something a layout or archive holds (and safe
/// as a map key: no `..`, no absolute path, at most three components).
fn wanted(name: &str) -> bool {
    let comps: Vec<&str> = name.split('/').collect();
    if comps.len() > 3
        || comps
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == ".." || c.len() > 128)
    {
        return false;
    }
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b))
}

/// Imports the image at `path` (directory or tar) and names it `tag` (or
/// the names the archive carries). Returns the record and its references.
pub fn import(
    store: &Store,
    path: &Path,
    tag: Option<&str>,
    opts: &CommitOptions<'_>,
) -> Result<(ImageRecord, Vec<String>), ImportError> {
    let tag = tag
        .map(normalize)
        .transpose()
        .map_err(|e| ImportError::Format {
            path: path.to_path_buf(),
            message: e,
        })?;
    let mut w = store.begin_write()?;
    let md = fs::metadata(path).map_err(io_err("stat", path))?;
    let files = if md.is_dir() {
        Files {
            root: path.to_path_buf(),
            extracted: None,
        }
    } else {
        extract_tar(&mut w, path)?
    };
    if files.path("index.json").is_some() && files.path("oci-layout").is_some() {
        import_oci(w, &files, tag, opts)
    } else if files.path("manifest.json").is_some() {
        import_docker(w, &files, tag, opts)
    } else {
        Err(files.bad(
            "neither an OCI image layout (oci-layout + index.json) nor a docker save archive (manifest.json)".into(),
        ))
    }
}

fn extract_tar(w: &mut Writer, path: &Path) -> Result<Files, ImportError> {
    let f = File::open(path).map_err(io_err("open", path))?;
    let mut ar = tar::Archive::new(io::BufReader::with_capacity(1 << 20, f));
    let mut map = BTreeMap::new();
    let entries = ar.entries().map_err(io_err("read tar", path))?;
    for e in entries {
        let mut e = e.map_err(io_err("read tar", path))?;
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = match e.path() {
            Ok(p) => p.to_string_lossy().trim_start_matches("./").to_string(),
            Err(_) => continue,
        };
        if !wanted(&name) || map.contains_key(&name) {
            continue;
        }
        let tmp = w.temp_path("import");
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        io::copy(&mut e, &mut out).map_err(io_err("extract", &tmp))?;
        map.insert(name, tmp);
    }
    Ok(Files {
        root: path.to_path_buf(),
        extracted: Some(map),
    })
}

fn blob_name(d: &Digest) -> String {
    format!("blobs/sha256/{}", d.hex())
}

fn import_oci(
    mut w: Writer,
    files: &Files,
    tag: Option<String>,
    opts: &CommitOptions<'_>,
) -> Result<(ImageRecord, Vec<String>), ImportError> {
    let index: ImageIndex = serde_json::from_slice(&files.read_json("index.json")?)
        .map_err(|e| files.bad(format!("index.json: {e}")))?;
    // Candidates: image manifests, nested indexes resolved to linux/amd64.
    let mut candidates = Vec::new();
    for desc in index.manifests() {
        let d = Digest::parse(desc.digest().as_ref()).map_err(|e| files.bad(e.to_string()))?;
        let bytes = read_verified(files, &d, Some(desc.size()), "manifest")?;
        let ann = desc.annotations().clone().unwrap_or_default();
        let media = desc.media_type().to_string();
        if media.contains("index") || media.contains("manifest.list") {
            let nested: ImageIndex =
                serde_json::from_slice(&bytes).map_err(|e| files.bad(format!("index {d}: {e}")))?;
            let Some(pick) = crate::pull::select_platform(&nested) else {
                continue;
            };
            let pd = Digest::parse(pick.digest().as_ref()).map_err(|e| files.bad(e.to_string()))?;
            let pb = read_verified(files, &pd, Some(pick.size()), "manifest")?;
            candidates.push((pd, pb, ann));
        } else {
            candidates.push((d, bytes, ann));
        }
    }
    let name_of = |ann: &std::collections::HashMap<String, String>| {
        ann.get("io.containerd.image.name")
            .cloned()
            .or_else(|| ann.get("org.opencontainers.image.ref.name").cloned())
    };
    if candidates.len() > 1 {
        let wanted_tag = tag
            .as_deref()
            .and_then(|t| t.rsplit_once(':').map(|(_, t)| t.to_string()));
        candidates.retain(|(_, _, ann)| {
            name_of(ann).is_some_and(|n| {
                Some(n.rsplit(':').next().unwrap_or(&n).to_string()) == wanted_tag
                    || Some(&n) == tag.as_ref()
            })
        });
    }
    let [(digest, manifest, ann)] = <[_; 1]>::try_from(candidates).map_err(|c| {
        files.bad(format!(
            "index.json names {} linux/amd64 images; pass --tag with the one to import",
            c.len()
        ))
    })?;
    let refs =
        match tag {
            Some(t) => vec![t],
            None => match ann.get("io.containerd.image.name").map(|n| normalize(n)) {
                Some(Ok(n)) => vec![n],
                _ => return Err(files.bad(
                    "the layout does not name its image (io.containerd.image.name): pass --tag REF"
                        .into(),
                )),
            },
        };
    let m: ImageManifest = serde_json::from_slice(&manifest)
        .map_err(|e| VerifyError::Invalid(format!("manifest {digest}: {e}")))?;
    let cd = Digest::parse(m.config().digest().as_ref()).map_err(|e| files.bad(e.to_string()))?;
    stage_file(
        &mut w,
        files,
        &blob_name(&cd),
        &cd,
        Some(m.config().size()),
        "config",
        opts,
    )?;
    for l in m.layers() {
        let ld = Digest::parse(l.digest().as_ref()).map_err(|e| files.bad(e.to_string()))?;
        stage_file(
            &mut w,
            files,
            &blob_name(&ld),
            &ld,
            Some(l.size()),
            "layer",
            opts,
        )?;
    }
    w.stage(
        &manifest[..],
        &digest,
        Some(manifest.len() as u64),
        "manifest",
    )?;
    let rec = w.commit(&manifest, &digest, &refs, opts)?;
    info!(image = %digest, references = ?refs, "image imported (OCI layout)");
    Ok((rec, refs))
}

fn read_verified(
    files: &Files,
    d: &Digest,
    size: Option<u64>,
    what: &str,
) -> Result<Vec<u8>, ImportError> {
    let bytes = files.read_json(&blob_name(d))?;
    let got = Digest::of(&bytes);
    crate::verify_blob(what, d, size, &got, bytes.len() as u64)?;
    Ok(bytes)
}

fn stage_file(
    w: &mut Writer,
    files: &Files,
    name: &str,
    d: &Digest,
    size: Option<u64>,
    what: &str,
    opts: &CommitOptions<'_>,
) -> Result<(), ImportError> {
    if w.blob(d).is_some() {
        opts.progress.blob_done(d, true);
        return Ok(());
    }
    opts.progress.blob_start(what, d, size);
    let f = files.open(name)?;
    w.stage(f, d, size, what)?;
    opts.progress.blob_done(d, false);
    crate::failpoint_hit("image:after_blob");
    Ok(())
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// Stages a file whose digest is only known by hashing it; returns it.
fn stage_unknown(
    w: &mut Writer,
    files: &Files,
    name: &str,
    what: &str,
) -> Result<(Digest, u64), ImportError> {
    // Hash first (read once), then copy verified against that hash: the
    // name says nothing we could check it with.
    let mut r = HashingReader::new(files.open(name)?);
    io::copy(&mut r, &mut io::sink()).map_err(|e| io_err("read", Path::new(name))(e))?;
    let (d, n) = r.finish().map_err(|e| io_err("read", Path::new(name))(e))?;
    if w.blob(&d).is_none() {
        w.stage(files.open(name)?, &d, Some(n), what)?;
    }
    Ok((d, n))
}

fn import_docker(
    mut w: Writer,
    files: &Files,
    tag: Option<String>,
    opts: &CommitOptions<'_>,
) -> Result<(ImageRecord, Vec<String>), ImportError> {
    let entries: Vec<DockerEntry> = serde_json::from_slice(&files.read_json("manifest.json")?)
        .map_err(|e| files.bad(format!("manifest.json: {e}")))?;
    let entry = match (entries.len(), &tag) {
        (1, _) => &entries[0],
        (_, Some(t)) => entries
            .iter()
            .find(|e| {
                e.repo_tags
                    .iter()
                    .flatten()
                    .any(|rt| normalize(rt).ok().as_ref() == Some(t))
            })
            .ok_or_else(|| files.bad(format!("manifest.json has no image tagged {t}")))?,
        (n, None) => {
            return Err(files.bad(format!(
                "manifest.json lists {n} images; pass --tag with the one to import"
            )))
        }
    };
    let refs: Vec<String> = match tag {
        Some(t) => vec![t],
        None => entry
            .repo_tags
            .iter()
            .flatten()
            .map(|t| normalize(t))
            .collect::<Result<_, _>>()
            .map_err(|e| files.bad(e))?,
    };
    if refs.is_empty() {
        return Err(
            files.bad("the archive does not name its image (RepoTags): pass --tag REF".into())
        );
    }
    // The config: named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
    let config_hex = entry
        .config
        .trim_start_matches("blobs/sha256/")
        .trim_end_matches(".json");
    let cd = Digest::parse(&format!("sha256:{config_hex}")).map_err(|_| {
        files.bad(format!(
            "config {:?} is not named by its digest",
            entry.config
        ))
    })?;
    let config_bytes = files.read_json(&entry.config)?;
    crate::verify_blob(
        "config",
        &cd,
        None,
        &Digest::of(&config_bytes),
        config_bytes.len() as u64,
    )?;
    w.stage(&config_bytes[..], &cd, None, "config")?;
    // Layers: uncompressed tars whose digest is their diff_id (checked at
    // unpack); a name of the form blobs/sha256/<hex> is checked too.
    let mut layers = Vec::new();
    for name in &entry.layers {
        let (ld, n) = stage_unknown(&mut w, files, name, "layer")?;
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            if hex != ld.hex() {
                return Err(VerifyError::Digest {
                    what: "layer".into(),
                    expected: format!("sha256:{hex}"),
                    got: ld.to_string(),
                    bytes: n,
                }
                .into());
            }
        }
        let media = sniff_media(&w, &ld)?;
        layers.push(serde_json::json!({"mediaType": media, "digest": ld.as_str(), "size": n}));
        crate::failpoint_hit("image:after_blob");
    }
    // The archive has no manifest of its own: the image's identity is the
    // digest of the OCI manifest made from what was verified.
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cd.as_str(),
            "size": config_bytes.len(),
        },
        "layers": layers,
    }))
    .expect("manifest serializes");
    let digest = Digest::of(&manifest);
    w.stage(&manifest[..], &digest, None, "manifest")?;
    let rec = w.commit(&manifest, &digest, &refs, opts)?;
    info!(image = %digest, references = ?refs, "image imported (docker save archive)");
    Ok((rec, refs))
}

/// The layer media type from the blob's first bytes (`docker save` layers
/// are plain tars; some tools compress them).
fn sniff_media(w: &Writer, d: &Digest) -> Result<&'static str, ImportError> {
    let p = w.blob(d).expect("just staged");
    let mut magic = [0u8; 4];
    let mut f = File::open(&p).map_err(io_err("open", &p))?;
    let n = f.read(&mut magic).map_err(io_err("read", &p))?;
    Ok(match &magic[..n.min(4)] {
        [0x1f, 0x8b, ..] => "application/vnd.oci.image.layer.v1.tar+gzip",
        [0x28, 0xb5, 0x2f, 0xfd] => "application/vnd.oci.image.layer.v1.tar+zstd",
        _ => "application/vnd.oci.image.layer.v1.tar",
    })
}
