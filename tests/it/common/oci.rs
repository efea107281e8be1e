//! Images built by the tests themselves: layer tars, an OCI image layout
//! and a `docker save` archive (the documented formats), from the host's
//! static busybox (Debian `busybox-static`) and files of the test's own.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

pub fn sha256(b: &[u8]) -> String {
    let mut s = String::from("sha256:");
    for x in Sha256::digest(b) {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// One entry of a test layer.
pub enum Entry {
    File(String, Vec<u8>, u32),
    Dir(String),
    Symlink(String, String),
}

/// An uncompressed layer tar of `entries`.
pub fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        match e {
            Entry::File(p, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap();
            }
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Entry::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// The busybox layer: `/bin/busybox` (static, from the host) and the
/// applets the tests use as symlinks. Fails naming the package when the
/// host has no static busybox.
pub fn busybox_layer() -> Vec<u8> {
    let bb = std::fs::read("/bin/busybox")
        .expect("/bin/busybox is missing: apt-get install busybox-static (see .ci/run)");
    let mut entries = vec![
        Entry::Dir("bin".into()),
        Entry::File("bin/busybox".into(), bb, 0o755),
    ];
    for applet in [
        "sh", "cat", "ls", "id", "echo", "test", "env", "sleep", "true",
    ] {
        entries.push(Entry::Symlink(format!("bin/{applet}"), "busybox".into()));
    }
    layer_tar(&entries)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar (what `docker save` writes).
    None,
    Gzip,
    Zstd,
}

impl Compression {
    fn media_type(self) -> &'static str {
        match self {
            Compression::None => "application/vnd.oci.image.layer.v1.tar",
            Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }

    fn compress(self, b: &[u8]) -> Vec<u8> {
        use std::io::Write;
        match self {
            Compression::None => b.to_vec(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(b).unwrap();
                e.finish().unwrap()
            }
            Compression::Zstd => zstd::encode_all(b, 3).unwrap(),
        }
    }
}

/// An image: layers (uncompressed tar, compression), env.
pub struct Image {
    pub layers: Vec<(Vec<u8>, Compression)>,
    pub env: Vec<String>,
    /// Replace diff_ids[i] with a wrong digest (verification tests).
    pub wrong_diff_id: Option<usize>,
}

impl Image {
    pub fn config(&self) -> Vec<u8> {
        let mut diff_ids: Vec<String> = self.layers.iter().map(|(t, _)| sha256(t)).collect();
        if let Some(i) = self.wrong_diff_id {
            diff_ids[i] = sha256(b"not this layer");
        }
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": self.env,
                "Entrypoint": ["/bin/false"],
                "User": "0:0",
                "WorkingDir": "/nonexistent",
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap()
    }

    /// Writes a layout whose index.json names an image index of two
    /// platforms: this image as linux/amd64, and a one-file image whose
    /// config says linux/arm64. Returns the amd64 manifest's digest.
    pub fn write_multiarch_layout(&self, dir: &Path, ref_name: &str) -> String {
        let amd64 = self.write_oci_layout(dir, ref_name);
        let blobs = dir.join("blobs/sha256");
        let put = |b: &[u8]| {
            let d = sha256(b);
            std::fs::write(blobs.join(&d[7..]), b).unwrap();
            (d, b.len())
        };
        let layer = layer_tar(&[Entry::File("arm".into(), b"arm64\n".to_vec(), 0o644)]);
        let (ld, ll) = put(&layer);
        let (cd, cl) = put(&serde_json::to_vec(&serde_json::json!({
            "architecture": "arm64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [ld]},
        }))
        .unwrap());
        let (armd, arml) = put(
            &serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cl},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ll}],
            }))
            .unwrap(),
        );
        let amd64_len = std::fs::metadata(blobs.join(&amd64[7..])).unwrap().len();
        // arm64 first: the selection must look at the platform, not the order.
        let (idx, idx_len) = put(
            &serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": armd, "size": arml,
                     "platform": {"architecture": "arm64", "os": "linux"}},
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64, "size": amd64_len,
                     "platform": {"architecture": "amd64", "os": "linux"}},
                ],
            }))
            .unwrap(),
        );
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "manifests": [{
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "digest": idx, "size": idx_len,
                    "annotations": {"org.opencontainers.image.ref.name": ref_name},
                }],
            }))
            .unwrap(),
        )
        .unwrap();
        amd64
    }

    /// Writes an OCI image layout at `dir`; returns the manifest digest.
    pub fn write_oci_layout(&self, dir: &Path, ref_name: &str) -> String {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let put = |b: &[u8]| {
            let d = sha256(b);
            std::fs::write(blobs.join(&d[7..]), b).unwrap();
            d
        };
        let config = self.config();
        let cd = put(&config);
        let layers: Vec<serde_json::Value> = self
            .layers
            .iter()
            .map(|(t, c)| {
                let blob = c.compress(t);
                let d = put(&blob);
                serde_json::json!({"mediaType": c.media_type(), "digest": d, "size": blob.len()})
            })
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": layers,
        }))
        .unwrap();
        let md = put(&manifest);
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "manifests": [{
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": md, "size": manifest.len(),
                    "annotations": {"org.opencontainers.image.ref.name": ref_name},
                }],
            }))
            .unwrap(),
        )
        .unwrap();
        md
    }

    /// Writes a `docker save` archive (manifest.json, `<hex>.json` config,
    /// `<n>/layer.tar` layers, uncompressed) at `path`.
    pub fn write_docker_save(&self, path: &Path, repo_tag: &str) {
        let config = self.config();
        let cd = sha256(&config);
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, data).unwrap();
        };
        let config_name = format!("{}.json", &cd[7..]);
        add(&config_name, &config);
        let mut layer_names = Vec::new();
        for (i, (t, _)) in self.layers.iter().enumerate() {
            let name = format!("layer{i}/layer.tar");
            add(&name, t);
            layer_names.push(name);
        }
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": [repo_tag], "Layers": layer_names,
        }]))
        .unwrap();
        add("manifest.json", &manifest);
        std::fs::write(path, b.into_inner().unwrap()).unwrap();
    }
}

/// The test image: busybox (gzip) and a layer of marker files (zstd), with
/// an env of its own.
pub fn busybox_image() -> Image {
    let markers = layer_tar(&[
        Entry::File("image-marker".into(), b"from-the-image\n".to_vec(), 0o644),
        Entry::Dir("etc".into()),
        Entry::File(
            "etc/os-release".into(),
            b"ID=sandboxd-test-image\n".to_vec(),
            0o644,
        ),
        // Replaced by the store with a plain file (a mount point).
        Entry::Symlink(
            "etc/resolv.conf".into(),
            "/run/systemd/resolve/stub-resolv.conf".into(),
        ),
    ]);
    Image {
        layers: vec![
            (busybox_layer(), Compression::Gzip),
            (markers, Compression::Zstd),
        ],
        env: vec![
            "PATH=/bin:/image-bin".to_string(),
            "IMAGE_VAR=set-by-image".to_string(),
            "LANG=C".to_string(),
        ],
        wrong_diff_id: None,
    }
}

/// Runs `sandboxd image ARGS` over `state_dir`; returns (success, stdout, stderr).
pub fn image_cli(state_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.arg("image")
        .arg(args[0])
        .arg("--state-dir")
        .arg(state_dir)
        .args(&args[1..])
        .env_remove("SANDBOXD_CONFIG")
        .env_remove("SANDBOX_IMAGE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run sandboxd image");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// What the store holds besides its lock files: (blobs, rootfs dirs,
/// records, tmp entries).
pub fn store_contents(state_dir: &Path) -> (usize, usize, usize, usize) {
    let n = |p: PathBuf| std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0);
    let s = state_dir.join("images");
    (
        n(s.join("blobs/sha256")),
        n(s.join("rootfs")),
        n(s.join("images")),
        n(s.join("tmp")),
    )
}

/// A registry of the test's own: Debian's `docker-registry` (the CNCF
/// distribution server) on a free loopback port, storing under a temp dir.
pub struct Registry {
    child: std::process::Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub root: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_auth(None)
    }

    /// With `Some((user, password))`: HTTP basic auth (htpasswd, bcrypt by
    /// `htpasswd` of apache2-utils) on every request.
    pub fn start_auth(creds: Option<(&str, &str)>) -> Registry {
        Registry::start_with(|root| {
            let (user, password) = creds?;
            let htpasswd = which("htpasswd")
                .expect("htpasswd is missing: apt-get install apache2-utils (see .ci/run)");
            let out = std::process::Command::new(htpasswd)
                .args(["-Bbn", user, password])
                .output()
                .unwrap();
            assert!(out.status.success());
            let file = root.join("htpasswd");
            std::fs::write(&file, &out.stdout).unwrap();
            Some(format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            ))
        })
    }

    /// Docker token auth: clients are sent to `tokens`' realm for a JWT,
    /// which the registry verifies against the token server's certificate
    /// (`rootcertbundle`), issuer and service.
    pub fn start_token(tokens: &TokenServer) -> Registry {
        Registry::start_token_trusting(tokens, &tokens.cert)
    }

    /// [`start_token`](Self::start_token), trusting `cert` (not
    /// necessarily the token server's) as its `rootcertbundle`.
    pub fn start_token_trusting(tokens: &TokenServer, cert: &Path) -> Registry {
        Registry::start_with(|_| {
            Some(format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                tokens.realm,
                TokenServer::SERVICE,
                TokenServer::ISSUER,
                cert.display()
            ))
        })
    }

    /// A registry whose config gets the `auth:` section `auth` returns
    /// (given the registry's temp root).
    fn start_with(auth: impl FnOnce(&Path) -> Option<String>) -> Registry {
        let bin = which("docker-registry")
            .expect("docker-registry is missing: apt-get install docker-registry (see .ci/run)");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let root = tempfile::tempdir().unwrap();
        let config = root.path().join("config.yml");
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            root.path().join("data").display()
        );
        if let Some(a) = auth(root.path()) {
            yml.push_str(&a);
        }
        std::fs::write(&config, yml).unwrap();
        let child = std::process::Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not listen on {addr}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Registry { child, addr, root }
    }

    /// Pushes the OCI layout `layout` (its image named `tag` in index.json)
    /// to `repo:tag` with skopeo; returns the full reference.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) -> String {
        self.push_as(layout, tag, repo, None)
    }

    /// [`push`](Self::push) with `user:password` credentials.
    pub fn push_as(&self, layout: &Path, tag: &str, repo: &str, creds: Option<&str>) -> String {
        self.push_with(layout, tag, repo, creds, &[])
    }

    /// [`push_as`](Self::push_as) with more `skopeo copy` arguments.
    pub fn push_with(
        &self,
        layout: &Path,
        tag: &str,
        repo: &str,
        creds: Option<&str>,
        extra: &[&str],
    ) -> String {
        let skopeo =
            which("skopeo").expect("skopeo is missing: apt-get install skopeo (see .ci/run)");
        let dest = format!("{}/{repo}:{tag}", self.addr);
        let mut cmd = std::process::Command::new(skopeo);
        cmd.args([
            "--insecure-policy",
            "copy",
            "--dest-tls-verify=false",
            "--quiet",
        ]);
        if let Some(c) = creds {
            cmd.arg(format!("--dest-creds={c}"));
        }
        cmd.args(extra);
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{dest}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy to {dest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dest
    }

    /// The file the registry serves blob `digest` from.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = &digest[7..];
        self.root
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The layer digests (as pushed) of the layout's manifest `manifest`.
pub fn layer_digests(layout: &Path, manifest: &str) -> Vec<String> {
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(&manifest[7..])).unwrap(),
    )
    .unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// A registry token server of the test's own (`tests/py/token_server.py`,
/// Python's stdlib HTTP server on a free loopback port): it checks the
/// client's basic credentials against `user`/`password` and issues JWTs
/// signed RS256 (by `openssl dgst`) with a key whose self-signed
/// certificate (made here by `openssl req`) rides in the token's `x5c`
/// header and is the registry's `rootcertbundle`.
pub struct TokenServer {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT/token`
    pub realm: String,
    /// The certificate the registry trusts.
    pub cert: PathBuf,
    /// One JSON line per token request: `{"granted", "user", "scopes", "access"}`.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl TokenServer {
    pub const SERVICE: &'static str = "sandboxd-test-registry";
    pub const ISSUER: &'static str = "sandboxd-test-token-issuer";

    pub fn start(user: &str, password: &str) -> TokenServer {
        let openssl =
            which("openssl").expect("openssl is missing: apt-get install openssl (see .ci/run)");
        let python =
            which("python3").expect("python3 is missing: apt-get install python3 (see .ci/run)");
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let cert = dir.path().join("cert.pem");
        let out = std::process::Command::new(openssl)
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=sandboxd-test-token-issuer", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl req: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = dir.path().join("tokens.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/token_server.py");
        let mut child = std::process::Command::new(python)
            .arg(&script)
            .arg(&key)
            .arg(&cert)
            .args([Self::ISSUER, Self::SERVICE, user, password])
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start tests/py/token_server.py");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("token server did not print its port: {line:?}"));
        TokenServer {
            child,
            realm: format!("http://127.0.0.1:{port}/token"),
            cert,
            log,
            _dir: dir,
        }
    }

    /// The token requests so far (one JSON object each).
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
