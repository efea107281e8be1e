//! Pulling from an OCI distribution registry with `oci-client` (the
//! protocol, token and basic auth), verifying everything ourselves: a
//! manifest pulled by digest must hash to it (and the registry's
//! `Docker-Content-Digest`, when sent, must agree), an index is resolved to
//! its `linux/amd64` manifest (itself verified against the index's digest),
//! and every blob is hashed while it streams into the store's `tmp/` and
//! compared with its descriptor (digest and size) before anything uses it.
//! Layers are then checked against `rootfs.diff_ids` while they unpack.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use tokio::io::AsyncWriteExt;
use tracing::info;

use crate::assemble::{CommitOptions, Writer};
use crate::digest::{Digest, Hasher};
use crate::store::{ImageRecord, Store, StoreError};
use crate::{Progress, VerifyError};

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("registry: {0}")]
    Registry(String),
    #[error("{0}")]
    Reference(String),
    #[error("auth file {path}: {message}")]
    Auth { path: PathBuf, message: String },
}

impl From<VerifyError> for PullError {
    fn from(e: VerifyError) -> Self {
        PullError::Store(StoreError::Verify(e))
    }
}

impl PullError {
    /// The verification failure, when that is what stopped the pull.
    pub fn verification(&self) -> Option<&VerifyError> {
        match self {
            PullError::Store(StoreError::Verify(v)) => Some(v),
            _ => None,
        }
    }
}

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// `host:port` entries spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// A Docker-style `config.json` with `auths`.
    pub auth_file: Option<PathBuf>,
}

/// What a pull needs.
pub struct PullOptions<'a> {
    pub registry: &'a RegistryOptions,
    pub commit: CommitOptions<'a>,
}

/// The index entry for this node's platform (`linux/amd64` on x86-64).
pub fn select_platform(index: &ImageIndex) -> Option<&Descriptor> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    index.manifests().iter().find(|d| {
        d.platform()
            .as_ref()
            .is_some_and(|p| p.os().to_string() == "linux" && p.architecture().to_string() == arch)
    })
}

/// Installs the process's rustls crypto provider (ring) once.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Credentials for `reference`'s registry from a Docker-style config.
pub fn auth_for(
    reference: &Reference,
    auth_file: Option<&Path>,
) -> Result<RegistryAuth, PullError> {
    let Some(path) = auth_file else {
        return Ok(RegistryAuth::Anonymous);
    };
    let bad = |message: String| PullError::Auth {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let Some(auths) = v.get("auths").and_then(|a| a.as_object()) else {
        return Ok(RegistryAuth::Anonymous);
    };
    let want = [reference.registry(), reference.resolve_registry()];
    for (key, entry) in auths {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("");
        if !want.contains(&host) {
            continue;
        }
        if let Some(a) = entry.get("auth").and_then(|a| a.as_str()) {
            use base64::Engine;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|e| bad(format!("auths.{key}.auth: {e}")))?;
            let raw = String::from_utf8(raw).map_err(|e| bad(format!("auths.{key}.auth: {e}")))?;
            let (u, p) = raw
                .split_once(':')
                .ok_or_else(|| bad(format!("auths.{key}.auth is not base64(user:password)")))?;
            return Ok(RegistryAuth::Basic(u.to_string(), p.to_string()));
        }
        if let (Some(u), Some(p)) = (
            entry.get("username").and_then(|x| x.as_str()),
            entry.get("password").and_then(|x| x.as_str()),
        ) {
            return Ok(RegistryAuth::Basic(u.to_string(), p.to_string()));
        }
        if let Some(t) = entry.get("registrytoken").and_then(|x| x.as_str()) {
            return Ok(RegistryAuth::Bearer(t.to_string()));
        }
    }
    Ok(RegistryAuth::Anonymous)
}

fn client(opts: &RegistryOptions) -> Client {
    install_crypto_provider();
    Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(opts.insecure.clone()),
        platform_resolver: None,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })
}

fn registry_err(e: oci_client::errors::OciDistributionError) -> PullError {
    PullError::Registry(e.to_string())
}

const ACCEPTED: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// Pulls `reference` into `store` (blocking the store's write lock for the
/// pull: pulls of one node run one at a time, and a second pull of an
/// image the first one stored finds it there). Returns the record and the
/// normalized references it now has.
pub async fn pull(
    store: &Store,
    reference: &str,
    opts: &PullOptions<'_>,
) -> Result<(ImageRecord, Vec<String>), PullError> {
    let r = crate::reference::parse(reference).map_err(PullError::Reference)?;
    let name = r.whole();
    let auth = auth_for(&r, opts.registry.auth_file.as_deref())?;
    let s = store.clone();
    let mut w = tokio::task::spawn_blocking(move || s.begin_write())
        .await
        .map_err(|e| PullError::Registry(format!("pull task: {e}")))??;
    if let Some(d) = r.digest() {
        let d = Digest::parse(d).map_err(|e| PullError::Reference(e.to_string()))?;
        if let Some(rec) = store.record(&d)? {
            store.tag(&d, std::slice::from_ref(&name))?;
            return Ok((rec, vec![name]));
        }
    }
    let started = std::time::Instant::now();
    let c = client(opts.registry);
    // With credentials, authenticate first: on a token (bearer) registry
    // oci-client would otherwise drop the token server's refusal and go on
    // without a token, ending in a bare "Not authorized".
    if !matches!(auth, RegistryAuth::Anonymous) {
        c.auth(&r, &auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(|e| {
                PullError::Registry(format!(
                    "{} refused the credentials the auth file has for it: {e}",
                    r.resolve_registry()
                ))
            })?;
    }
    let (bytes, header_digest) =
        c.pull_manifest_raw(&r, &auth, ACCEPTED)
            .await
            .map_err(|e| match (&e, &auth) {
                (oci_client::errors::OciDistributionError::UnauthorizedError { .. }, a) => {
                    PullError::Registry(if matches!(a, RegistryAuth::Anonymous) {
                        format!(
                            "{e} (no credentials for {}: add them to the [images] auth_file)",
                            r.resolve_registry()
                        )
                    } else {
                        format!(
                            "{e} ({} refused the credentials the auth file has for it)",
                            r.resolve_registry()
                        )
                    })
                }
                _ => registry_err(e),
            })?;
    let got = Digest::of(&bytes);
    verify_manifest(&r, &bytes, &got, &header_digest)?;
    let mut refs = vec![name];
    let (manifest, digest) = if is_index(&bytes) {
        let index: ImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| VerifyError::Invalid(format!("image index {got}: {e}")))?;
        let pick = select_platform(&index).ok_or_else(|| {
            VerifyError::Invalid(format!("image index {got} has no linux/amd64 image"))
        })?;
        let pd = Digest::parse(pick.digest().as_ref())
            .map_err(|e| VerifyError::Invalid(e.to_string()))?;
        let pr = r.clone_with_digest(pd.to_string());
        let (pb, ph) = c
            .pull_manifest_raw(&pr, &auth, ACCEPTED)
            .await
            .map_err(registry_err)?;
        let pg = Digest::of(&pb);
        verify_manifest(&pr, &pb, &pg, &ph)?;
        if pick.size() != pb.len() as u64 {
            return Err(VerifyError::Size {
                what: "manifest".into(),
                digest: pd.to_string(),
                expected: pick.size(),
                got: pb.len() as u64,
            }
            .into());
        }
        (pb.to_vec(), pd)
    } else {
        (bytes.to_vec(), got)
    };
    if is_index(&manifest) {
        return Err(VerifyError::Invalid("an index inside an index".into()).into());
    }
    if let Some(rec) = store.record(&digest)? {
        store.tag(&digest, &refs)?;
        info!(reference, image = %digest, "image already present");
        return Ok((rec, refs));
    }
    let m: ImageManifest = serde_json::from_slice(&manifest)
        .map_err(|e| VerifyError::Invalid(format!("manifest {digest}: {e}")))?;
    // An image whose blobs alone are over the unpack limit is refused
    // before anything is downloaded.
    let declared: u64 = std::iter::once(m.config())
        .chain(m.layers())
        .map(|d| d.size())
        .fold(0u64, u64::saturating_add);
    if declared > opts.commit.limits.max_total_bytes {
        return Err(VerifyError::Invalid(format!(
            "manifest {digest} declares {declared} bytes of blobs, over the image limit of {} bytes",
            opts.commit.limits.max_total_bytes
        ))
        .into());
    }
    let mut total = 0u64;
    fetch_blob(
        &c,
        &r,
        &mut w,
        m.config(),
        "config",
        opts.commit.progress,
        &mut total,
    )
    .await?;
    for l in m.layers() {
        fetch_blob(&c, &r, &mut w, l, "layer", opts.commit.progress, &mut total).await?;
    }
    w.stage(&manifest[..], &digest, None, "manifest")?;
    let fetched = started.elapsed();
    // Unpack off the async workers (the commit reads and writes files);
    // needs a multi-threaded runtime.
    let rec = tokio::task::block_in_place(|| w.commit(&manifest, &digest, &refs, &opts.commit))?;
    info!(
        reference,
        image = %digest,
        fetched_bytes = total,
        fetch_seconds = fetched.as_secs_f64(),
        seconds = started.elapsed().as_secs_f64(),
        "image pulled"
    );
    refs.dedup();
    Ok((rec, refs))
}

/// True when the JSON document is an index (manifest list).
fn is_index(bytes: &[u8]) -> bool {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    match v.get("mediaType").and_then(|m| m.as_str()) {
        Some(m) => m == OCI_IMAGE_INDEX_MEDIA_TYPE || m == IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        None => v.get("manifests").is_some(),
    }
}

/// A manifest pulled by digest must hash to it; the registry's
/// `Docker-Content-Digest` (when it sent one) must agree with the content.
fn verify_manifest(
    r: &Reference,
    bytes: &[u8],
    got: &Digest,
    header: &str,
) -> Result<(), VerifyError> {
    if let Some(want) = r.digest() {
        let want = Digest::parse(want).map_err(|e| VerifyError::Invalid(e.to_string()))?;
        crate::verify_blob("manifest", &want, None, got, bytes.len() as u64)?;
    }
    if let Ok(h) = Digest::parse(header) {
        crate::verify_blob(
            "manifest (Docker-Content-Digest)",
            &h,
            None,
            got,
            bytes.len() as u64,
        )?;
    }
    Ok(())
}

async fn fetch_blob(
    c: &Client,
    r: &Reference,
    w: &mut Writer,
    desc: &Descriptor,
    what: &str,
    progress: &dyn Progress,
    total: &mut u64,
) -> Result<(), PullError> {
    let d = Digest::parse(desc.digest().as_ref())
        .map_err(|e| VerifyError::Invalid(format!("{what}: {e}")))?;
    if w.blob(&d).is_some() {
        progress.blob_done(&d, true);
        return Ok(());
    }
    let size = desc.size();
    progress.blob_start(what, &d, Some(size));
    let tmp = w.temp_path("blob");
    let mut stream = c
        .pull_blob_stream(r, d.as_str())
        .await
        .map_err(registry_err)?;
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .await
        .map_err(crate::store::io_err("create", &tmp))?;
    let mut h = Hasher::default();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                // oci-client checks the digest too, and reports a mismatch
                // as a stream error after the last byte: say what is wrong
                // in our words when our own check fails.
                let (got, n) = std::mem::take(&mut h).finish();
                crate::verify_blob(what, &d, Some(size), &got, n)?;
                return Err(PullError::Registry(format!("{what} {d}: {e}")));
            }
        };
        if h.count() + chunk.len() as u64 > size {
            // More than the descriptor says: stop reading now.
            return Err(VerifyError::Size {
                what: what.into(),
                digest: d.to_string(),
                expected: size,
                got: h.count() + chunk.len() as u64,
            }
            .into());
        }
        h.update(&chunk);
        f.write_all(&chunk)
            .await
            .map_err(crate::store::io_err("write", &tmp))?;
        progress.blob_bytes(&d, chunk.len() as u64);
    }
    f.sync_all()
        .await
        .map_err(crate::store::io_err("fsync", &tmp))?;
    drop(f);
    let (got, n) = h.finish();
    crate::verify_blob(what, &d, Some(size), &got, n)?;
    *total += n;
    w.stage_verified(&d, tmp);
    progress.blob_done(&d, false);
    crate::failpoint_hit("image:after_blob");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_from_docker_config() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        // base64("alice:s3cret")
        std::fs::write(
            &p,
            r#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "Ym9iOmh1bnRlcjI="},
                "127.0.0.1:5000": {"auth": "YWxpY2U6czNjcmV0"},
                "reg.example.com": {"username": "u", "password": "p"}
            }}"#,
        )
        .unwrap();
        let r = |s: &str| crate::reference::parse(s).unwrap();
        let basic = |a: RegistryAuth| match a {
            RegistryAuth::Basic(u, p) => format!("{u}:{p}"),
            other => format!("{other:?}"),
        };
        assert_eq!(
            basic(auth_for(&r("127.0.0.1:5000/t/x:1"), Some(&p)).unwrap()),
            "alice:s3cret"
        );
        assert_eq!(
            basic(auth_for(&r("busybox"), Some(&p)).unwrap()),
            "bob:hunter2"
        );
        assert_eq!(
            basic(auth_for(&r("reg.example.com/a:1"), Some(&p)).unwrap()),
            "u:p"
        );
        assert!(matches!(
            auth_for(&r("other.example.com/a:1"), Some(&p)).unwrap(),
            RegistryAuth::Anonymous
        ));
        assert!(matches!(
            auth_for(&r("a:1"), None).unwrap(),
            RegistryAuth::Anonymous
        ));
        std::fs::write(&p, "not json").unwrap();
        assert!(auth_for(&r("a:1"), Some(&p)).is_err());
    }
}
