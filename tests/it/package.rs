//! The Debian package (`cargo deb`, metadata in the root `Cargo.toml`,
//! files under `deploy/debian/`).
//!
//! - The generated files the package ships (the commented default config,
//!   the unit with `/usr/bin/sandboxd`, man pages, completions) are what
//!   the binary generates now; `UPDATE_GOLDEN=1` rewrites them.
//! - As root: the package is built from the binaries of this test build
//!   (`cargo deb --no-build`, no release build: see docs/operations.md),
//!   installed with `dpkg -i`, checked (files and modes, `systemd-analyze
//!   verify`, `--version`, `seccomp check`, enabled but not started, a
//!   sandbox created by the installed daemon from `/usr/libexec/sandboxd`),
//!   removed (`/var/lib/sandboxd` and the conffile stay) and purged
//!   (nothing stays). Whatever happens, the package is purged at the end;
//!   the test refuses to run where sandboxd is installed or
//!   `/var/lib/sandboxd` exists, so it never touches an operator's data.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{privileged, sibling_bin, Daemon, NativeDirs};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");
/// `cargo install cargo-deb --locked --version` of `.ci/run`.
const CARGO_DEB: &str = "3.8.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    eprintln!(
        "$ {cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn generated(args: &[&str]) -> String {
    ok(Command::new(BIN).args(args))
}

/// The files under deploy/debian/ that are generated, with their content.
fn generated_files() -> Vec<(PathBuf, String)> {
    let dir = repo().join("deploy/debian");
    let unit = std::fs::read_to_string(repo().join("systemd/sandboxd.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/sandboxd "));
    let unit = format!(
        "# Generated from systemd/sandboxd.service for the Debian package (sandboxd in /usr/bin).\n{}",
        unit.replace("/usr/local/bin/sandboxd", "/usr/bin/sandboxd")
    );
    let mut files = vec![
        (dir.join("config.toml"), generated(&["config", "default"])),
        (dir.join("sandboxd.service"), unit),
        (
            dir.join("completions/sandboxd.bash"),
            generated(&["completions", "bash"]),
        ),
        (
            dir.join("completions/_sandboxd"),
            generated(&["completions", "zsh"]),
        ),
        (
            dir.join("completions/sandboxd.fish"),
            generated(&["completions", "fish"]),
        ),
    ];
    let man = tempfile::tempdir().unwrap();
    ok(Command::new(BIN).arg("man").arg(man.path()));
    let mut pages: Vec<_> = std::fs::read_dir(man.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    assert!(pages.iter().any(|p| p.ends_with("sandboxd.1")));
    for p in pages {
        files.push((
            dir.join("man").join(p.file_name().unwrap()),
            std::fs::read_to_string(&p).unwrap(),
        ));
    }
    files
}

#[test]
fn the_packaged_generated_files_are_current() {
    let files = generated_files();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    if update {
        let _ = std::fs::remove_dir_all(repo().join("deploy/debian/man"));
    }
    for (path, text) in &files {
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            &committed == text,
            "{} is not what the binary generates now: regenerate with \
             `UPDATE_GOLDEN=1 cargo test --test it package::the_packaged`",
            path.display()
        );
    }
    // No stale man page of a removed subcommand.
    let mut committed: Vec<_> = std::fs::read_dir(repo().join("deploy/debian/man"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    committed.sort();
    let mut want: Vec<_> = files
        .iter()
        .map(|(p, _)| p.clone())
        .filter(|p| p.parent().unwrap().ends_with("man"))
        .collect();
    want.sort();
    assert_eq!(
        committed, want,
        "deploy/debian/man: UPDATE_GOLDEN=1 regenerates it"
    );
}

/// Purges the package at the end, whatever happened.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let installed = Command::new("dpkg")
            .args(["-s", "sandboxd"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if installed {
            let _ = run(Command::new("dpkg").args(["--purge", "sandboxd"]));
        }
        // The postrm deletes it on purge; if the purge itself failed, the
        // directory is still the one this test created (it refuses to run
        // when one exists).
        let _ = std::fs::remove_dir_all("/var/lib/sandboxd");
    }
}

fn mode(p: &str) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .permissions()
        .mode()
        & 0o7777
}

fn dpkg_status() -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "sandboxd"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Processes running `/usr/bin/sandboxd`.
fn installed_daemons() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path().join("exe"))
                .map(|p| p == Path::new("/usr/bin/sandboxd"))
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_package_installs_removes_and_purges_cleanly() {
    if !privileged("the_package_installs_removes_and_purges_cleanly") {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let version = Command::new(&cargo).args(["deb", "--version"]).output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "cargo-deb is missing: cargo install cargo-deb --locked --version {CARGO_DEB} (.ci/run does)"
    );
    for tool in [
        "dpkg",
        "dpkg-query",
        "deb-systemd-helper",
        "systemd-analyze",
    ] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .status()
                .unwrap()
                .success(),
            "{tool} is missing (apt-get install dpkg init-system-helpers systemd; .ci/run does)"
        );
    }
    assert!(
        !dpkg_status().contains("installed") && !dpkg_status().contains("config-files"),
        "sandboxd is already installed on this machine ({}): this test installs and purges \
         the package, so it runs only where it is absent",
        dpkg_status()
    );
    assert!(
        !Path::new("/var/lib/sandboxd").exists(),
        "/var/lib/sandboxd exists: this test purges the package, which deletes it; \
         run it on a machine without one"
    );
    let _purge = Purge;

    // Package the binaries of this build: cargo-deb takes them from
    // <target dir>/release/ with --no-build.
    let stage = tempfile::tempdir().unwrap();
    let release = stage.path().join("release");
    std::fs::create_dir_all(&release).unwrap();
    // The agent where the build script leaves it (static-agent/<target
    // triple>/<profile>/), as the package metadata names it.
    let agent_dir = release.join("static-agent/host/release");
    std::fs::create_dir_all(&agent_dir).unwrap();
    for (to, from) in [
        (release.join("sandboxd"), PathBuf::from(BIN)),
        (release.join("sandbox-init"), sibling_bin("sandbox-init")),
        (
            agent_dir.join("sandbox-agent"),
            sibling_bin("sandbox-agent"),
        ),
    ] {
        std::fs::copy(&from, &to).unwrap();
    }
    let out_dir = stage.path().join("debian");
    let started = std::time::Instant::now();
    ok(Command::new(&cargo)
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", stage.path())
        .args(["deb", "--no-build", "--fast", "--strip", "--output"])
        .arg(&out_dir));
    eprintln!("cargo deb --no-build took {:?}", started.elapsed());
    let deb = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("cargo deb made no .deb");

    // Install: files, modes, units, enabled and not started.
    let install = ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(install.contains("enabled, not started"), "{install}");
    assert!(dpkg_status().ends_with("installed"), "{}", dpkg_status());
    for (p, m) in [
        ("/usr/bin/sandboxd", 0o755),
        ("/usr/libexec/sandboxd/sandbox-init", 0o755),
        ("/usr/libexec/sandboxd/sandbox-agent", 0o755),
        ("/etc/sandboxd/config.toml", 0o600),
        ("/var/lib/sandboxd", 0o700),
        ("/usr/lib/systemd/system/sandboxd.service", 0o644),
        ("/usr/lib/systemd/system/sandboxd.socket", 0o644),
        ("/usr/share/sandboxd/seccomp/default.json", 0o644),
        ("/usr/share/bash-completion/completions/sandboxd", 0o644),
        ("/usr/share/zsh/vendor-completions/_sandboxd", 0o644),
        ("/usr/share/fish/vendor_completions.d/sandboxd.fish", 0o644),
        ("/usr/share/doc/sandboxd/operations.md", 0o644),
    ] {
        assert_eq!(mode(p), m, "mode of {p}");
        assert_eq!(std::fs::metadata(p).unwrap().uid(), 0, "owner of {p}");
    }
    let man = std::fs::read_dir("/usr/share/man/man1")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sandboxd"))
        .count();
    assert!(man >= 5, "{man} sandboxd man pages installed");
    assert_eq!(
        std::fs::read_to_string("/etc/sandboxd/config.toml").unwrap(),
        generated(&["config", "default"])
    );
    let conffiles = ok(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "sandboxd"]));
    assert!(
        conffiles.contains("/etc/sandboxd/config.toml"),
        "{conffiles}"
    );

    let verify = run(Command::new("systemd-analyze").args([
        "verify",
        "/usr/lib/systemd/system/sandboxd.service",
        "/usr/lib/systemd/system/sandboxd.socket",
    ]));
    assert!(
        verify.status.success(),
        "systemd-analyze verify of the installed units failed"
    );
    let version = ok(Command::new("/usr/bin/sandboxd").arg("--version"));
    assert!(
        version.starts_with(&format!("sandboxd {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    ok(Command::new("/usr/bin/sandboxd").args(["seccomp", "check"]));
    assert!(
        Path::new("/etc/systemd/system/multi-user.target.wants/sandboxd.service").exists(),
        "the service is not enabled"
    );
    assert!(
        !Path::new("/etc/systemd/system/sockets.target.wants/sandboxd.socket").exists(),
        "the optional socket unit was enabled"
    );
    assert_eq!(installed_daemons(), 0, "the install started the daemon");

    // The installed daemon finds its launcher and agent in
    // /usr/libexec/sandboxd and creates a sandbox with them.
    {
        let dirs = NativeDirs::new();
        let d = Daemon::start_native_program(
            Path::new("/usr/bin/sandboxd"),
            &dirs,
            tempfile::tempdir().unwrap(),
            &[("SANDBOXD_NETWORK", "none")],
            "127.0.0.1:0",
        );
        let (s, v) = d
            .create(serde_json::json!({
                "sandbox_id": "pkg", "thread_id": "t", "uid": "u", "inherit_env": false
            }))
            .await;
        assert_eq!(s, 200, "{v}");
        let (out, code) = d.exec("pkg", "echo from-the-package").await;
        assert_eq!((out.trim(), code), ("from-the-package", 0));
        let (s, _) = d.json("DELETE", "/api/sandboxes/pkg", None).await;
        assert_eq!(s, 200);
    }

    // Remove: binaries gone, user data and the conffile stay, with a message.
    std::fs::write("/var/lib/sandboxd/keep-me", "user data").unwrap();
    let remove = run(Command::new("dpkg").args(["--remove", "sandboxd"]));
    assert!(remove.status.success());
    let said = String::from_utf8_lossy(&remove.stdout).into_owned()
        + &String::from_utf8_lossy(&remove.stderr);
    assert!(said.contains("kept /var/lib/sandboxd"), "{said}");
    assert_eq!(dpkg_status(), "deinstall ok config-files");
    assert!(!Path::new("/usr/bin/sandboxd").exists());
    assert!(!Path::new("/usr/libexec/sandboxd/sandbox-init").exists());
    assert_eq!(
        std::fs::read_to_string("/var/lib/sandboxd/keep-me").unwrap(),
        "user data"
    );
    assert_eq!(mode("/var/lib/sandboxd"), 0o700);
    assert!(Path::new("/etc/sandboxd/config.toml").exists());

    // Purge: everything goes, with a message.
    let purge = run(Command::new("dpkg").args(["--purge", "sandboxd"]));
    assert!(purge.status.success());
    let said = String::from_utf8_lossy(&purge.stdout).into_owned()
        + &String::from_utf8_lossy(&purge.stderr);
    assert!(said.contains("deleting /var/lib/sandboxd"), "{said}");
    assert_eq!(dpkg_status(), "");
    for gone in [
        "/var/lib/sandboxd",
        "/etc/sandboxd",
        "/usr/libexec/sandboxd",
        "/usr/share/sandboxd",
        "/usr/lib/systemd/system/sandboxd.service",
        "/etc/systemd/system/multi-user.target.wants/sandboxd.service",
        "/etc/systemd/system/sandboxd.service",
    ] {
        assert!(
            std::fs::symlink_metadata(gone).is_err(),
            "{gone} is left after the purge"
        );
    }
}
