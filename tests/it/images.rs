//! OCI images as native sandbox roots (`docs/images.md`): import (OCI
//! layout, `docker save`), pull from a real registry of the test's own
//! (Debian's `docker-registry`, on a loopback port, fed by `skopeo`), every
//! verification failure leaving nothing behind, and sandboxes that see the
//! image's files and none of the host's.

use std::path::Path;

use crate::common::oci::{
    busybox_image, image_cli, layer_digests, layer_tar, store_contents, which, Compression, Entry,
    Image, Registry, TokenServer,
};
use crate::common::{create_body, privileged, require_failpoints, Daemon, NativeDirs, TOKEN};

const TAG: &str = "localhost/test/busybox:1";

/// Writes the busybox test image as an OCI layout and imports it into the
/// store at `state` as [`TAG`]; returns its digest and the import's output.
fn import_busybox(state: &Path) -> (String, String) {
    let layout = tempfile::tempdir().unwrap();
    let digest = busybox_image().write_oci_layout(layout.path(), "1");
    let (ok, out, err) = image_cli(
        state,
        &["import", layout.path().to_str().unwrap(), "--tag", TAG],
        &[],
    );
    assert!(ok, "import failed: {err}");
    (digest, out)
}

/// What a sandbox of the busybox image must see (and not see).
async fn assert_runs_the_image(d: &Daemon, id: &str) {
    let (out, code) = d
        .exec(
            id,
            "cat /image-marker; cat /etc/os-release; echo IMAGE_VAR=$IMAGE_VAR; echo PATH=$PATH; \
             id -u; pwd; \
             test -e /usr/bin/bash && echo HOST-BASH || echo no-host-bash; \
             test -e /usr/lib/x86_64-linux-gnu/libc.so.6 && echo HOST-LIBC || echo no-libc; \
             cat /etc/passwd; echo x > /image-marker 2>/dev/null && echo WROTE-ROOT || echo root-read-only; \
             echo y > /tmp/t && echo tmp-writable",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    for want in [
        "from-the-image",
        "ID=sandboxd-test-image",
        "IMAGE_VAR=set-by-image",
        "PATH=/bin:/image-bin",
        "1000",
        "/home/gem",
        "no-host-bash",
        "no-libc",
        "gem:x:1000:1000",
        "root-read-only",
        "tmp-writable",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(
        !out.contains("HOST-") && !out.contains("WROTE-ROOT"),
        "{out}"
    );
}

/// Docker-style `config.json` files for `registry` in `dir`: one with
/// alice's right password (as `auth`, base64 of `alice:s3cret`), one with a
/// wrong one (as `username`/`password`).
fn auth_files(dir: &Path, registry: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let auth = dir.join("auth.json");
    std::fs::write(
        &auth,
        format!(r#"{{"auths": {{"{registry}": {{"auth": "YWxpY2U6czNjcmV0"}}}}}}"#),
    )
    .unwrap();
    let wrong = dir.join("wrong.json");
    std::fs::write(
        &wrong,
        format!(r#"{{"auths": {{"{registry}": {{"username": "alice", "password": "nope"}}}}}}"#),
    )
    .unwrap();
    (auth, wrong)
}

#[tokio::test(flavor = "multi_thread")]
async fn imported_oci_layout_runs_as_the_sandbox_root() {
    if !privileged("imported_oci_layout_runs_as_the_sandbox_root") {
        return;
    }
    let dirs = NativeDirs::new();
    let state = tempfile::tempdir().unwrap();
    let layout = tempfile::tempdir().unwrap();
    let (digest, out) = import_busybox(state.path());
    assert!(out.contains(&digest), "{out}");
    let (ok, out, _) = image_cli(state.path(), &["ls"], &[]);
    assert!(
        ok && out.contains(TAG) && out.contains(&digest[..19]),
        "{out}"
    );

    // `sandboxd bundle` writes what a create of that image would use.
    let out_dir = layout.path().join("bundle-out");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args([
            "bundle",
            "--sandbox-id",
            "b1",
            "--uid",
            "u1",
            "--image",
            TAG,
            "--out",
        ])
        .arg(&out_dir)
        .env_remove("SANDBOXD_CONFIG")
        .env("SANDBOXD_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("config.json")).unwrap()).unwrap();
    // The sandbox's `/` is the bundle's own skeleton (never the shared
    // image directory, whose top mount a sandbox's root could remount with
    // user namespaces); the image's top-level directories are read-only
    // binds into it.
    assert_eq!(spec["root"]["path"], "rootfs");
    assert_eq!(spec["root"]["readonly"], true);
    let image_root = state.path().join("images/rootfs").join(&digest[7..]);
    let image_binds: Vec<&serde_json::Value> = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["source"]
                .as_str()
                .is_some_and(|s| std::path::Path::new(s).starts_with(&image_root))
        })
        .collect();
    assert!(!image_binds.is_empty(), "no image bind: {}", spec["mounts"]);
    for m in &image_binds {
        let opts = m["options"].to_string();
        assert!(opts.contains("\"ro\""), "image bind not read-only: {m}");
    }
    assert!(
        !spec["mounts"].to_string().contains("\"source\":\"/usr\""),
        "a host /usr bind in image mode"
    );
    assert_eq!(spec["annotations"]["sandboxd.io/image"], TAG);
    let env = spec["process"]["env"].to_string();
    assert!(
        env.contains("IMAGE_VAR=set-by-image") && env.contains("PATH=/bin:/image-bin"),
        "{env}"
    );
    assert!(
        !spec["mounts"].to_string().contains("\"/usr\""),
        "a host /usr bind in image mode"
    );

    let d = Daemon::start_native_in(
        &dirs,
        state,
        &[("SANDBOX_IMAGE", TAG), ("SANDBOXD_NETWORK", "none")],
    );
    let (s, v) = d.create(create_body("img-a", "t", "u1")).await;
    assert_eq!(s, 200, "{v}");
    assert_runs_the_image(&d, "img-a").await;

    // In use: rm and gc keep it.
    let (ok, _, err) = image_cli(d.state_dir.path(), &["rm", TAG], &[]);
    assert!(!ok && err.contains("used by sandbox(es) img-a"), "{err}");
    let (ok, _, _) = image_cli(d.state_dir.path(), &["gc"], &[]);
    assert!(ok);
    assert_eq!(
        store_contents(d.state_dir.path()).1,
        1,
        "gc removed a used rootfs"
    );

    let (s, v) = d.json("DELETE", "/api/sandboxes/img-a", None).await;
    assert_eq!(s, 200, "{v}");
    let (ok, out, err) = image_cli(d.state_dir.path(), &["rm", TAG], &[]);
    assert!(ok, "{err}");
    assert!(out.contains("removed"), "{out}");
    let (ok, _, _) = image_cli(d.state_dir.path(), &["gc"], &[]);
    assert!(ok);
    assert_eq!(store_contents(d.state_dir.path()), (0, 0, 0, 0));
}

#[test]
fn docker_save_import_and_verification_failures_leave_nothing() {
    if !privileged("docker_save_import_and_verification_failures_leave_nothing") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    // A docker save archive imports, named by its RepoTags.
    let archive = work.path().join("save.tar");
    busybox_image().write_docker_save(&archive, "test/saved:2");
    let state = tempfile::tempdir().unwrap();
    let (ok, out, err) = image_cli(state.path(), &["import", archive.to_str().unwrap()], &[]);
    assert!(ok, "{err}");
    assert!(out.contains("docker.io/test/saved:2"), "{out}");
    let (_, out, _) = image_cli(state.path(), &["ls", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["reference"], "docker.io/test/saved:2");
    let rootfs = state
        .path()
        .join("images/rootfs")
        .join(&v["digest"].as_str().unwrap()[7..]);
    assert_eq!(
        std::fs::read_to_string(rootfs.join("image-marker")).unwrap(),
        "from-the-image\n"
    );
    // The mount points are plain files and directories, never links.
    assert!(rootfs
        .join("etc/resolv.conf")
        .symlink_metadata()
        .unwrap()
        .is_file());
    assert!(rootfs.join(".sandboxd/sandbox-agent").is_file());

    // An OCI layout as a tar (what `skopeo copy ... oci-archive:` writes).
    let layout = work.path().join("layout");
    let digest = busybox_image().write_oci_layout(&layout, "1");
    let oci_tar = work.path().join("layout.tar");
    let mut t = tar::Builder::new(std::fs::File::create(&oci_tar).unwrap());
    t.append_dir_all(".", &layout).unwrap();
    t.finish().unwrap();
    drop(t);
    let (ok, out, err) = image_cli(
        state.path(),
        &["import", oci_tar.to_str().unwrap(), "--tag", TAG],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&digest), "{out}");
    // Both images are listed.
    let (_, out, _) = image_cli(state.path(), &["ls"], &[]);
    assert!(
        out.contains(TAG) && out.contains("docker.io/test/saved:2"),
        "{out}"
    );

    let fresh = || tempfile::tempdir().unwrap();
    let expect_refused = |src: &Path, needle: &str| {
        let state = fresh();
        let (ok, _, err) = image_cli(
            state.path(),
            &["import", src.to_str().unwrap(), "--tag", TAG],
            &[],
        );
        assert!(!ok, "a bad image was imported ({needle})");
        assert!(err.contains(needle), "error lacks {needle:?}: {err}");
        assert_eq!(
            store_contents(state.path()),
            (0, 0, 0, 0),
            "{needle}: leftovers"
        );
    };

    // A wrong diff_id (docker save and OCI layout).
    let mut bad = busybox_image();
    bad.wrong_diff_id = Some(1);
    let archive = work.path().join("bad-diff.tar");
    bad.write_docker_save(&archive, "test/bad:1");
    expect_refused(&archive, "rootfs.diff_ids[1]");
    let layout = work.path().join("bad-diff");
    bad.write_oci_layout(&layout, "1");
    expect_refused(&layout, "rootfs.diff_ids[1]");

    // A tampered blob: same size, one byte changed.
    let layout = work.path().join("tampered");
    busybox_image().write_oci_layout(&layout, "1");
    let blob = biggest_blob(&layout);
    let mut b = std::fs::read(&blob).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&blob, &b).unwrap();
    expect_refused(&layout, "digest mismatch");

    // A truncated blob.
    let layout = work.path().join("truncated");
    busybox_image().write_oci_layout(&layout, "1");
    let blob = biggest_blob(&layout);
    let b = std::fs::read(&blob).unwrap();
    std::fs::write(&blob, &b[..b.len() / 2]).unwrap();
    expect_refused(&layout, "size mismatch");

    // Not an image at all.
    expect_refused(work.path(), "neither an OCI image layout");

    // An unpacked docker save directory naming a file outside itself.
    let dir = work.path().join("escape");
    std::fs::create_dir(&dir).unwrap();
    let img = busybox_image();
    let config = img.config();
    let config_name = format!("{}.json", &crate::common::oci::sha256(&config)[7..]);
    std::fs::write(dir.join(&config_name), &config).unwrap();
    std::fs::write(work.path().join("outside.tar"), &img.layers[0].0).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": ["test/escape:1"],
            "Layers": ["../outside.tar", "../outside.tar"],
        }]))
        .unwrap(),
    )
    .unwrap();
    expect_refused(&dir, "../outside.tar is missing");
}

fn biggest_blob(layout: &Path) -> std::path::PathBuf {
    std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .path()
}

/// A hostile layer (an absolute symlink escape, then a file written
/// through it) is contained by the unpacker: nothing lands on the host.
#[test]
fn hostile_layer_is_contained() {
    if !privileged("hostile_layer_is_contained") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("host-target");
    std::fs::create_dir(&target).unwrap();
    let evil = layer_tar(&[
        Entry::Symlink("escape".into(), target.to_string_lossy().to_string()),
        Entry::File("escape/pwned".into(), b"x".to_vec(), 0o644),
        Entry::File("ok".into(), b"fine".to_vec(), 0o644),
    ]);
    let img = Image {
        layers: vec![(evil, Compression::None)],
        env: vec![],
        wrong_diff_id: None,
    };
    let layout = work.path().join("evil");
    img.write_oci_layout(&layout, "1");
    let state = tempfile::tempdir().unwrap();
    let (_ok, _, _err) = image_cli(
        state.path(),
        &["import", layout.to_str().unwrap(), "--tag", TAG],
        &[],
    );
    // Refused or contained: either way the host directory stays empty.
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        0,
        "a layer wrote outside its rootfs"
    );
}

/// The value of a `/metrics` sample (first line starting with `name`).
async fn metric(d: &Daemon, name: &str) -> Option<f64> {
    let (s, _, body) = d.call("GET", "/metrics", None, Some(TOKEN)).await;
    assert_eq!(s, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_pull_by_tag_and_digest_and_concurrent_creates_pull_once() {
    if !privileged("registry_pull_by_tag_and_digest_and_concurrent_creates_pull_once") {
        return;
    }
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    busybox_image().write_oci_layout(&layout, "1");
    let by_tag = reg.push(&layout, "1", "test/busybox");
    let insecure = [("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str())];

    // The CLI, by tag: the digest it prints is the manifest's.
    let s1 = tempfile::tempdir().unwrap();
    let (ok, out, err) = image_cli(s1.path(), &["pull", &by_tag], &insecure);
    assert!(ok, "pull by tag: {err}");
    let digest = out
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("no digest in {out:?}"))
        .to_string();
    // Plain progress lines when stderr is not a terminal.
    assert!(err.contains("verified"), "{err}");
    // Without the insecure list the registry is spoken to over HTTPS (and fails).
    let s0 = tempfile::tempdir().unwrap();
    let (ok, _, err) = image_cli(s0.path(), &["pull", &by_tag], &[]);
    assert!(!ok, "plain HTTP used without insecure_registries");
    assert!(err.contains("pulling"), "{err}");
    assert_eq!(store_contents(s0.path()), (0, 0, 0, 0));

    // The daemon, by digest, as its default image, pulled in the
    // background; two concurrent creates wait for the same one pull.
    let by_digest = format!("{}/test/busybox@{digest}", reg.addr);
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOX_IMAGE", by_digest.as_str()),
            ("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str()),
            ("SANDBOXD_NETWORK", "none"),
        ],
    );
    let (a, b) = tokio::join!(
        d.create(create_body("reg-a", "t", "u1")),
        d.create(create_body("reg-b", "t", "u2"))
    );
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(b.0, 200, "{}", b.1);
    assert_runs_the_image(&d, "reg-a").await;
    assert_runs_the_image(&d, "reg-b").await;
    assert_eq!(
        metric(&d, "sandboxd_image_pulls{result=\"ok\"}").await,
        Some(1.0),
        "two creates pulled more than once"
    );
    assert!(metric(&d, "sandboxd_image_pull_bytes").await.unwrap_or(0.0) > 100_000.0);
    for id in ["reg-a", "reg-b"] {
        let (s, v) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
    }
}

#[test]
fn registry_verification_failures_leave_nothing() {
    if !privileged("registry_verification_failures_leave_nothing") {
        return;
    }
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let insecure = [("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str())];
    let refused = |reference: &str, needle: &str| {
        let state = tempfile::tempdir().unwrap();
        let (ok, _, err) = image_cli(state.path(), &["pull", reference], &insecure);
        assert!(!ok, "{reference}: a bad image was pulled ({needle})");
        assert!(
            err.contains(needle),
            "{reference}: error lacks {needle:?}: {err}"
        );
        assert_eq!(
            store_contents(state.path()),
            (0, 0, 0, 0),
            "{reference}: leftovers"
        );
    };

    // A wrong diff_id in the config.
    let mut bad = busybox_image();
    bad.wrong_diff_id = Some(0);
    let layout = work.path().join("bad");
    bad.write_oci_layout(&layout, "1");
    let r = reg.push(&layout, "1", "test/bad");
    refused(&r, "rootfs.diff_ids[0]");

    // A blob the registry serves tampered with (same size), then truncated.
    let layout = work.path().join("good");
    let manifest = busybox_image().write_oci_layout(&layout, "1");
    let r = reg.push(&layout, "1", "test/good");
    let layer = layer_digests(&layout, &manifest)[0].clone();
    let data = reg.blob_data(&layer);
    let orig = std::fs::read(&data).unwrap();
    let mut b = orig.clone();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&data, &b).unwrap();
    refused(&r, "digest mismatch");
    std::fs::write(&data, &orig[..orig.len() / 2]).unwrap();
    refused(&r, "size mismatch");
    std::fs::write(&data, &orig).unwrap();

    // Docker's manifest format (schema 2, gzip layers) pulls as well.
    let mut v2 = busybox_image();
    v2.layers[1].1 = Compression::Gzip;
    let layout = work.path().join("v2s2");
    v2.write_oci_layout(&layout, "1");
    let r2 = reg.push_with(&layout, "1", "test/v2s2", None, &["--format", "v2s2"]);
    let state = tempfile::tempdir().unwrap();
    let (ok, _, err) = image_cli(state.path(), &["pull", &r2], &insecure);
    assert!(ok, "docker schema 2: {err}");
    let blobs = state.path().join("images/blobs/sha256");
    let manifests: Vec<String> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|t| t.contains("schemaVersion"))
        .collect();
    assert!(
        manifests
            .iter()
            .any(|m| m.contains("application/vnd.docker.distribution.manifest.v2+json")),
        "not a docker schema 2 manifest: {manifests:?}"
    );

    // A manifest asked for by a digest it does not have.
    let wrong = format!("{}/test/good@sha256:{}", reg.addr, "0".repeat(64));
    refused(&wrong, "pulling");
    // A tag that does not exist.
    refused(&format!("{}/test/good:nope", reg.addr), "pulling");

    // Intact again: the same pull works.
    let state = tempfile::tempdir().unwrap();
    let (ok, _, err) = image_cli(state.path(), &["pull", &r], &insecure);
    assert!(ok, "{err}");
}

/// Writes a config file allowing `allowed` in creates; returns its path.
fn config_allowing(dir: &Path, allowed: &[&str]) -> String {
    let p = dir.join("config.toml");
    let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(&p, format!("[images]\nallowed = [{}]\n", list.join(", "))).unwrap();
    p.to_string_lossy().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn create_image_field_allowed_identity_and_default_pull_wait() {
    if !privileged("create_image_field_allowed_identity_and_default_pull_wait") {
        return;
    }
    require_failpoints();
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    busybox_image().write_oci_layout(&layout, "1");
    let default = reg.push(&layout, "1", "test/busybox");
    let other = reg.push(&layout, "1", "test/other");
    let config = config_allowing(work.path(), &[&other]);
    let resume = work.path().join("resume");
    let dirs = NativeDirs::new();
    let d = Daemon::start_native(
        &dirs,
        &[
            ("SANDBOXD_CONFIG", config.as_str()),
            ("SANDBOX_IMAGE", default.as_str()),
            ("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str()),
            ("SANDBOXD_NETWORK", "none"),
            ("SANDBOX_HEALTH_TIMEOUT_SECONDS", "3"),
            // The default image's pull stops after its first blob until
            // `resume` exists.
            ("SANDBOXD_FAILPOINT", "image:after_blob"),
            ("SANDBOXD_FAILPOINT_PAUSE", resume.to_str().unwrap()),
        ],
    );
    // The default image is still being pulled: a create waits the health
    // timeout, then 503.
    let t = std::time::Instant::now();
    let (s, v) = d.create(create_body("def", "t", "u1")).await;
    assert_eq!(s, 503, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or("")
            .contains("still being pulled"),
        "{v}"
    );
    assert!(t.elapsed() >= std::time::Duration::from_secs(3));
    std::fs::write(&resume, b"").unwrap();
    let (s, v) = d.create(create_body("def", "t", "u1")).await;
    assert_eq!(s, 200, "{v}");
    assert_runs_the_image(&d, "def").await;

    // The create field: only references of [images] allowed.
    let mut body = create_body("x", "t", "u1");
    body["image"] = serde_json::json!(format!("{}/test/busybox:2", reg.addr));
    let (s, v) = d.create(body).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["detail"].as_str().unwrap_or("").contains("allowed"),
        "{v}"
    );
    let mut body = create_body("x", "t", "u1");
    body["image"] = serde_json::json!(other);
    let (s, v) = d.create(body.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_runs_the_image(&d, "x").await;
    // The same create again reuses it; without the image it is another
    // identity.
    let (s, _) = d.create(body).await;
    assert_eq!(s, 200);
    let (s, v) = d.create(create_body("x", "t", "u1")).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["detail"].as_str().unwrap_or("").contains("identity"),
        "{v}"
    );
    for id in ["def", "x"] {
        let (s, v) = d
            .json("DELETE", &format!("/api/sandboxes/{id}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
    }

    // A default image that cannot be pulled: a clear 503.
    let dirs2 = NativeDirs::new();
    let d2 = Daemon::start_native(
        &dirs2,
        &[
            ("SANDBOX_IMAGE", "127.0.0.1:1/nothing/here:1"),
            ("SANDBOXD_INSECURE_REGISTRIES", "127.0.0.1:1"),
            ("SANDBOXD_NETWORK", "none"),
        ],
    );
    let (s, v) = d2.create(create_body("none", "t", "u1")).await;
    assert_eq!(s, 503, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or("")
            .contains("127.0.0.1:1/nothing/here:1"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn daemon_killed_mid_pull_restarts_clean() {
    if !privileged("daemon_killed_mid_pull_restarts_clean") {
        return;
    }
    require_failpoints();
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    busybox_image().write_oci_layout(&layout, "1");
    let image = reg.push(&layout, "1", "test/busybox");
    let config = config_allowing(work.path(), &[&image]);
    let dirs = NativeDirs::new();
    let env = [
        ("SANDBOXD_CONFIG", config.as_str()),
        ("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str()),
        ("SANDBOXD_NETWORK", "none"),
    ];
    // After a verified blob; after every layer is unpacked into tmp/,
    // before anything is renamed into place.
    for point in ["image:after_blob", "image:before_commit"] {
        let mut armed = env.to_vec();
        armed.push(("SANDBOXD_FAILPOINT", point));
        let mut d = Daemon::start_native(&dirs, &armed);
        let mut body = create_body("k", "t", "u1");
        body["image"] = serde_json::json!(image);
        // The create's pull kills the daemon at `point`.
        let req = hyper::Request::builder()
            .method("POST")
            .uri(d.url("/api/sandboxes"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(crate::common::full(body.to_string()))
            .unwrap();
        let client = d.client.clone();
        let req = tokio::spawn(async move {
            let _ = client.request(req).await;
        });
        let status = tokio::task::block_in_place(|| d.child.wait()).unwrap();
        assert!(!status.success(), "{point} did not kill the daemon");
        let _ = req.await;
        let state = d.take_state_dir();
        let (_, _, _, tmp) = store_contents(state.path());
        assert!(tmp > 0, "{point}: the killed pull left nothing to clean up");
        assert_eq!(
            store_contents(state.path()).2,
            0,
            "{point}: a record of a half-pulled image"
        );

        // Restarted: the leftovers go at once; the create pulls and runs.
        let d = Daemon::start_native_in(&dirs, state, &env);
        assert!(d.log_contains("removing what an interrupted pull or import left"));
        assert_eq!(store_contents(d.state_dir.path()).3, 0);
        let mut body = create_body("k", "t", "u1");
        body["image"] = serde_json::json!(image);
        let (s, v) = d.create(body).await;
        assert_eq!(s, 200, "{v}");
        assert_runs_the_image(&d, "k").await;
        let (s, _) = d.json("DELETE", "/api/sandboxes/k", None).await;
        assert_eq!(s, 200);
    }
}

#[test]
fn registry_basic_auth_from_a_docker_config() {
    if !privileged("registry_basic_auth_from_a_docker_config") {
        return;
    }
    let reg = Registry::start_auth(Some(("alice", "s3cret")));
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    busybox_image().write_oci_layout(&layout, "1");
    let r = reg.push_as(&layout, "1", "test/private", Some("alice:s3cret"));
    let (auth, wrong) = auth_files(work.path(), &reg.addr);
    let insecure = ("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str());
    for (file, ok_expected) in [(None, false), (Some(&wrong), false), (Some(&auth), true)] {
        let state = tempfile::tempdir().unwrap();
        let mut env = vec![insecure];
        let f;
        if let Some(p) = file {
            f = p.to_string_lossy().to_string();
            env.push(("SANDBOXD_IMAGES_AUTH_FILE", f.as_str()));
        }
        let (ok, _, err) = image_cli(state.path(), &["pull", &r], &env);
        assert_eq!(ok, ok_expected, "auth file {file:?}: {err}");
        if !ok {
            let needle = match file {
                None => "no credentials for",
                Some(_) => "refused the credentials the auth file has for it",
            };
            assert!(
                err.contains("Not authorized") && err.contains(needle),
                "auth file {file:?}: error lacks {needle:?}: {err}"
            );
            assert_eq!(store_contents(state.path()), (0, 0, 0, 0));
        }
    }
}

/// Docker token auth: the registry (`auth: token:`) sends clients to a
/// token server of the test's own, which checks the basic credentials of
/// the Docker `config.json` and issues an RS256 JWT the registry verifies
/// against the token server's certificate (its `rootcertbundle`).
#[test]
fn registry_token_auth_from_a_docker_config() {
    if !privileged("registry_token_auth_from_a_docker_config") {
        return;
    }
    let tokens = TokenServer::start("alice", "s3cret");
    let reg = Registry::start_token(&tokens);
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    let manifest = busybox_image().write_oci_layout(&layout, "1");
    let r = reg.push_as(&layout, "1", "test/private", Some("alice:s3cret"));
    // skopeo went through the token server for push access.
    let granted = |actions: &str| {
        let want = format!("repository:test/private:{actions}");
        tokens.requests().iter().any(|t| {
            t["granted"] == true
                && t["user"] == "alice"
                && t["scopes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s.as_str() == Some(want.as_str()))
        })
    };
    assert!(
        granted("pull,push"),
        "skopeo's push did not use a token: {:?}",
        tokens.requests()
    );
    assert!(!granted("pull"), "a pull token before any pull");

    let (auth, wrong) = auth_files(work.path(), &reg.addr);
    let insecure = ("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str());
    let pull = |file: Option<&Path>| {
        let state = tempfile::tempdir().unwrap();
        let mut env = vec![insecure];
        let f;
        if let Some(p) = file {
            f = p.to_string_lossy().to_string();
            env.push(("SANDBOXD_IMAGES_AUTH_FILE", f.as_str()));
        }
        let (ok, out, err) = image_cli(state.path(), &["pull", &r], &env);
        (state, ok, out, err)
    };

    // No credentials: the token server refuses the anonymous token request
    // and the registry the tokenless manifest request (401). The wrong
    // password: the token server refuses, and the pull fails with its
    // answer. Either way nothing is stored.
    let refused = || {
        tokens
            .requests()
            .into_iter()
            .filter(|t| t["granted"] == false)
            .collect::<Vec<_>>()
    };
    let no_creds = format!(
        "Not authorized: url http://{}/v2/test/private/manifests/1 (no credentials for {}",
        reg.addr, reg.addr
    );
    let refused_creds = format!(
        "{} refused the credentials the auth file has for it: Authentication failure:",
        reg.addr
    );
    for (file, who, needles, user) in [
        (
            None,
            "no auth file",
            [no_creds.as_str(), "add them to the [images] auth_file"],
            serde_json::Value::Null,
        ),
        (
            Some(wrong.as_path()),
            "wrong password",
            [refused_creds.as_str(), "token server: bad credentials"],
            serde_json::json!("alice"),
        ),
    ] {
        let before = refused().len();
        let (state, ok, _, err) = pull(file);
        assert!(!ok, "{who}: pulled");
        assert!(
            err.contains(&format!("pulling {r}: registry: "))
                && needles.iter().all(|n| err.contains(n)),
            "{who}: error lacks {needles:?}: {err}"
        );
        assert_eq!(
            store_contents(state.path()),
            (0, 0, 0, 0),
            "{who}: leftovers"
        );
        let now = refused();
        assert_eq!(
            now.len(),
            before + 1,
            "{who}: the token server was not asked: {:?}",
            tokens.requests()
        );
        assert_eq!(now[before]["user"], user, "{who}: {:?}", now[before]);
    }
    assert!(!granted("pull"), "a token for wrong credentials");

    // The right credentials: a pull-only token, the image pulled and verified.
    let (state, ok, out, err) = pull(Some(&auth));
    assert!(ok, "right credentials: {err}");
    assert!(out.contains(&manifest), "{out}");
    assert!(err.contains("verified"), "{err}");
    assert!(
        granted("pull"),
        "the pull did not use a token: {:?}",
        tokens.requests()
    );
    let last = tokens.requests().pop().unwrap();
    assert_eq!(
        last["access"],
        serde_json::json!([{"type": "repository", "name": "test/private", "actions": ["pull"]}]),
        "{last}"
    );
    let rootfs = state.path().join("images/rootfs").join(&manifest[7..]);
    assert_eq!(
        std::fs::read_to_string(rootfs.join("image-marker")).unwrap(),
        "from-the-image\n"
    );
    assert_eq!(store_contents(state.path()).2, 1);

    // The registry checks the token's signature: an impostor token server
    // (its own key and certificate, same issuer and service) grants the
    // right credentials a token, which the registry trusting the real
    // certificate refuses (401, where an accepted token would have met a
    // 404 for this empty registry).
    let impostor = TokenServer::start("alice", "s3cret");
    let reg2 = Registry::start_token_trusting(&impostor, &tokens.cert);
    let r2 = format!("{}/test/private:1", reg2.addr);
    let auth2 = work.path().join("auth2.json");
    std::fs::write(
        &auth2,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "YWxpY2U6czNjcmV0"}}}}}}"#,
            reg2.addr
        ),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let f = auth2.to_string_lossy().to_string();
    let (ok, _, err) = image_cli(
        state.path(),
        &["pull", &r2],
        &[
            ("SANDBOXD_INSECURE_REGISTRIES", reg2.addr.as_str()),
            ("SANDBOXD_IMAGES_AUTH_FILE", f.as_str()),
        ],
    );
    assert!(!ok, "a token signed by an untrusted key was accepted");
    assert!(
        err.contains("Not authorized") && err.contains("refused the credentials"),
        "{err}"
    );
    assert!(
        impostor.requests().iter().any(|t| t["granted"] == true),
        "the impostor was not asked: {:?}",
        impostor.requests()
    );
    assert_eq!(store_contents(state.path()), (0, 0, 0, 0));
}

/// `sandboxd image pull` draws per-layer progress bars when stderr is a
/// terminal (here a pseudo-terminal of `script`, util-linux) and writes
/// plain per-layer lines, no escape sequences, otherwise.
#[test]
fn pull_progress_bars_on_a_tty_plain_lines_otherwise() {
    if !privileged("pull_progress_bars_on_a_tty_plain_lines_otherwise") {
        return;
    }
    let script = which("script").expect("script is missing: apt-get install bsdutils (util-linux)");
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("bb");
    let manifest = busybox_image().write_oci_layout(&layout, "1");
    let r = reg.push(&layout, "1", "test/busybox");
    let layers: Vec<String> = layer_digests(&layout, &manifest)
        .iter()
        .map(|d| d[7..19].to_string())
        .collect();
    assert_eq!(layers.len(), 2);

    // Not a terminal: one line per blob fetched and verified, per layer unpacked.
    let state = tempfile::tempdir().unwrap();
    let (ok, out, err) = image_cli(
        state.path(),
        &["pull", &r],
        &[("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str())],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&manifest), "{out}");
    for (i, l) in layers.iter().enumerate() {
        for want in [
            format!("layer {l}: fetching"),
            format!("{l} verified"),
            format!("unpacking layer {}/2 {l}", i + 1),
        ] {
            assert!(err.contains(&want), "no {want:?} in plain output:\n{err}");
        }
    }
    assert!(
        !err.contains('\x1b') && !err.contains('\r'),
        "escape sequences or carriage returns without a terminal: {err:?}"
    );

    // On a terminal: bars named by layer, drawn with escape sequences and
    // carriage returns, no plain lines.
    let state = tempfile::tempdir().unwrap();
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let cmd = [
        env!("CARGO_BIN_EXE_sandboxd"),
        "image",
        "pull",
        "--state-dir",
        state.path().to_str().unwrap(),
        &r,
    ]
    .iter()
    .map(|a| quote(a))
    .collect::<Vec<_>>()
    .join(" ");
    let run = std::process::Command::new(script)
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env_remove("SANDBOXD_CONFIG")
        .env_remove("SANDBOX_IMAGE")
        .env("SANDBOXD_INSECURE_REGISTRIES", &reg.addr)
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let tty = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "pull under a terminal: {tty:?} {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(tty.contains(&manifest), "{tty:?}");
    // (The terminal turns every "\n" into "\r\n"; a bar redraws its line
    // with a bare "\r" and erases with escape sequences.)
    assert!(
        tty.contains("\x1b[") && tty.replace("\r\n", "\n").contains('\r'),
        "no terminal drawing: {tty:?}"
    );
    for (i, l) in layers.iter().enumerate() {
        assert!(
            tty.contains(&format!("layer {l}")),
            "no bar for layer {l}: {tty:?}"
        );
        assert!(
            tty.contains(&format!("unpacking layer {}/2 {l}", i + 1)),
            "{tty:?}"
        );
        assert!(
            !tty.contains(&format!("layer {l}: fetching")),
            "plain lines on a terminal: {tty:?}"
        );
    }
    // A finished bar: full, with its byte counts.
    assert!(
        tty.contains(&format!("[{}]", "=".repeat(30))),
        "no finished bar: {tty:?}"
    );
}

#[test]
fn an_index_resolves_to_the_linux_amd64_image() {
    if !privileged("an_index_resolves_to_the_linux_amd64_image") {
        return;
    }
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("multi");
    let amd64 = busybox_image().write_multiarch_layout(&layout, "1");
    // Import: the nested index in the layout.
    let state = tempfile::tempdir().unwrap();
    let (ok, out, err) = image_cli(
        state.path(),
        &["import", layout.to_str().unwrap(), "--tag", TAG],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&amd64), "{out}");
    // Pull: by tag and by the index's digest, through the registry.
    let mut cmd = std::process::Command::new("skopeo");
    let out = cmd
        .args([
            "--insecure-policy",
            "copy",
            "--all",
            "--quiet",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!("docker://{}/test/multi:1", reg.addr))
        .output()
        .expect("skopeo is missing: apt-get install skopeo (see .ci/run)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The index as the registry holds it (skopeo may re-serialize it).
    let raw = std::process::Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/test/multi:1", reg.addr))
        .output()
        .unwrap();
    assert!(raw.status.success());
    let served: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
    assert_eq!(
        served["manifests"].as_array().unwrap().len(),
        2,
        "not an index: {served}"
    );
    let index = crate::common::oci::sha256(&raw.stdout);
    let insecure = [("SANDBOXD_INSECURE_REGISTRIES", reg.addr.as_str())];
    for r in [
        format!("{}/test/multi:1", reg.addr),
        format!("{}/test/multi@{index}", reg.addr),
    ] {
        let state = tempfile::tempdir().unwrap();
        let (ok, out, err) = image_cli(state.path(), &["pull", &r], &insecure);
        assert!(ok, "{r}: {err}");
        assert!(out.contains(&amd64), "{r}: not the amd64 image: {out}");
        // Only the amd64 image's blobs were fetched (no `arm` layer).
        let rootfs = state.path().join("images/rootfs").join(&amd64[7..]);
        assert!(rootfs.join("image-marker").exists() && !rootfs.join("arm").exists());
    }
}

/// With user namespaces, a sandbox's root (uid 0 in its own user
/// namespace, every capability, no seccomp: entered from the host with
/// `nsenter`) cannot make the shared image writable: the image's top-level
/// binds are locked read-only mounts, and the top of `/` is the bundle's
/// own skeleton (whose files belong to host root, which has no id inside),
/// never the store's directory of the image.
#[tokio::test(flavor = "multi_thread")]
async fn the_sandbox_root_cannot_write_the_shared_image() {
    if !privileged("the_sandbox_root_cannot_write_the_shared_image") {
        return;
    }
    let dirs = NativeDirs::new();
    let state = tempfile::tempdir().unwrap();
    let (digest, _) = import_busybox(state.path());
    let image_root = state.path().join("images/rootfs").join(&digest[7..]);
    assert!(image_root.join("image-marker").is_file());

    let d = Daemon::start_native_in(
        &dirs,
        state,
        &[
            ("SANDBOX_IMAGE", TAG),
            ("SANDBOXD_NETWORK", "none"),
            ("SANDBOXD_USERNS", "on"),
        ],
    );
    let (s, v) = d.create(create_body("img-root", "t", "u1")).await;
    assert_eq!(s, 200, "{v}");
    let st: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.state_dir.path().join("sandboxes/img-root/state.json")).unwrap(),
    )
    .unwrap();
    assert!(st["userns"]["host"].is_u64(), "no user namespace: {st}");
    let pid = st["pid"].as_u64().unwrap();

    // The image ships busybox with a few applet links only: call the
    // others through the binary.
    let script = "bb=/bin/busybox; $bb id -u; \
        for m in /bin /etc /image-marker /etc/os-release; do \
          $bb mount -o remount,bind,rw $m 2>/dev/null && echo LOOSENED $m; \
        done; \
        for m in /bin /etc; do $bb umount -l $m 2>/dev/null && echo UNMOUNTED $m; done; \
        $bb mount -o remount,bind,rw / 2>/dev/null; $bb mount -o remount,rw / 2>/dev/null; \
        $bb touch /probe 2>/dev/null && echo WROTE /probe; \
        $bb mkdir /probe-dir 2>/dev/null && echo WROTE /probe-dir; \
        (echo tampered > /image-marker) 2>/dev/null && echo WROTE /image-marker; \
        (echo tampered > /etc/os-release) 2>/dev/null && echo WROTE /etc/os-release; \
        $bb touch /bin/probe 2>/dev/null && echo WROTE /bin; \
        $bb chmod 777 /etc 2>/dev/null && echo WROTE /etc; \
        echo done";
    let text = crate::common::sh_as_sandbox_root(pid, false, script);
    for bad in ["LOOSENED", "UNMOUNTED", "WROTE"] {
        assert!(!text.contains(bad), "{text}");
    }
    // The store's copy is untouched.
    assert_eq!(
        std::fs::read_to_string(image_root.join("image-marker")).unwrap(),
        "from-the-image\n"
    );
    assert_eq!(
        std::fs::read_to_string(image_root.join("etc/os-release")).unwrap(),
        "ID=sandboxd-test-image\n"
    );
    assert!(!image_root.join("probe").exists());
    assert!(!image_root.join("bin/probe").exists());
    let (s, v) = d.json("DELETE", "/api/sandboxes/img-root", None).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn a_pool_member_runs_the_default_image() {
    if !privileged("a_pool_member_runs_the_default_image") {
        return;
    }
    let dirs = NativeDirs::new();
    let state = tempfile::tempdir().unwrap();
    import_busybox(state.path());
    let d = Daemon::start_native_in(
        &dirs,
        state,
        &[
            ("SANDBOX_IMAGE", TAG),
            ("SANDBOXD_NETWORK", "none"),
            ("SANDBOXD_POOL_SIZE", "1"),
        ],
    );
    assert!(
        d.wait_log("pool member ready", std::time::Duration::from_secs(30)),
        "no pool member started"
    );
    let (s, v) = d.create(create_body("img-p", "t", "u1")).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        d.wait_log(
            "claimed a pool member sandbox_id=img-p",
            std::time::Duration::from_secs(5)
        ),
        "the create did not claim the member"
    );
    assert_runs_the_image(&d, "img-p").await;
    // The members of the pool hold the default image too: `image rm` says so.
    let (ok, _, err) = image_cli(d.state_dir.path(), &["rm", TAG], &[]);
    assert!(!ok && err.contains("img-p"), "{err}");
}
