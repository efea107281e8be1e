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
//!   (nothing stays). All of it happens in a root of the test's own (an
//!   overlay over the host's `/` in a mount namespace of its own, see
//!   [`PackageRoot`]): the host's `/var/lib/sandboxd` (README's first
//!   command makes one), dpkg database, `/usr` and `/etc` are never written,
//!   and the test checks at the end that the host's `/var/lib/sandboxd` and
//!   the package's paths there are as they were. It refuses to run only
//!   where the package itself is installed on the host. Heavy tier
//!   (`#[ignore]`): `cargo test --test it -- --ignored`, which `.ci/run`
//!   runs after the fast tier.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::{privileged, require_tool, sibling_bin, Daemon, NativeDirs};

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

/// A root file system of the test's own: the host's `/` as the lower layer
/// of an overlay whose upper layer is a tmpfs, in a mount namespace of its
/// own, with the host's `/proc`, `/sys` (cgroups), `/dev` and temporary
/// directory bound in and a fresh `/run` (no systemd to talk to). Whatever
/// dpkg, the maintainer scripts and the installed daemon write goes to the
/// tmpfs: the host's dpkg database, `/usr`, `/etc` and `/var/lib/sandboxd`
/// are never written, and a `/var/lib/sandboxd` of the host (README's first
/// command makes one) is hidden by a whiteout, so the package meets an
/// empty place as on a fresh node. Killing the holder ends the namespace
/// and with it the overlay and everything in it.
struct PackageRoot {
    holder: std::process::Child,
    /// The tmpfs's mount point (empty on the host).
    _work: tempfile::TempDir,
}

const ROOT_SETUP: &str = r#"set -eu
w=$1 tmp=$2
mount -t tmpfs -o mode=0700 sandboxd-package-test "$w"
mkdir -p "$w/upper/var/lib" "$w/work" "$w/root"
mknod "$w/upper/var/lib/sandboxd" c 0 0
mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/root"
for d in /proc /sys /dev; do mount --rbind "$d" "$w/root$d"; done
mount --bind "$tmp" "$w/root$tmp"
mount -t tmpfs -o mode=0755 run "$w/root/run"
mkdir "$w/root/.old-root"
cd "$w/root"
pivot_root . .old-root
cd /
umount -l /.old-root
rmdir /.old-root
echo ready
exec sleep infinity
"#;

impl PackageRoot {
    fn new() -> PackageRoot {
        let work = tempfile::Builder::new()
            .prefix("sandboxd-package-root-")
            .tempdir()
            .unwrap();
        let tmp = std::env::temp_dir().canonicalize().unwrap();
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(ROOT_SETUP)
            .arg("sh")
            .arg(work.path())
            .arg(&tmp)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        if line.trim() != "ready" {
            let _ = holder.kill();
            panic!(
                "cannot set up the package test's own root: {:?}",
                holder.wait()
            );
        }
        PackageRoot {
            holder,
            _work: work,
        }
    }

    /// `program`, run in this root.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.args([
            "-t",
            &self.holder.id().to_string(),
            "-m",
            "-r",
            "-w",
            "--",
            program,
        ]);
        c
    }

    /// `p` (absolute) in this root, seen from the host; symbolic links in
    /// it resolve in the host's root, so test them with `symlink_metadata`.
    fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{p}", self.holder.id()))
    }

    fn exists(&self, p: &str) -> bool {
        std::fs::symlink_metadata(self.path(p)).is_ok()
    }

    fn meta(&self, p: &str) -> std::fs::Metadata {
        std::fs::metadata(self.path(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn dpkg_status(&self) -> String {
        let out = self
            .cmd("dpkg-query")
            .args(["-W", "-f=${Status}", "sandboxd"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PackageRoot {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Device, inode, modification time and mode of a directory, and the name,
/// inode and modification time of each entry.
type HostStateDir = (u64, u64, i64, u32, Vec<(String, u64, i64)>);

/// What can be seen of the host's `/var/lib/sandboxd` without reading user
/// data: its inode, modification time and mode, and the names, inodes and
/// modification times of its entries. None when there is none.
fn host_state_dir() -> Option<HostStateDir> {
    let m = std::fs::symlink_metadata("/var/lib/sandboxd").ok()?;
    let mut entries: Vec<_> = std::fs::read_dir("/var/lib/sandboxd")
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        m.ino(),
                        m.mtime(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    Some((m.dev(), m.ino(), m.mtime(), m.mode(), entries))
}

/// Which of the package's paths exist on the host.
fn host_paths() -> Vec<(&'static str, bool)> {
    [
        "/usr/bin/sandboxd",
        "/usr/libexec/sandboxd",
        "/etc/sandboxd",
        "/usr/share/sandboxd",
        "/usr/lib/systemd/system/sandboxd.service",
        "/etc/systemd/system/multi-user.target.wants/sandboxd.service",
    ]
    .into_iter()
    .map(|p| (p, std::fs::symlink_metadata(p).is_ok()))
    .collect()
}

fn host_dpkg_status() -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "sandboxd"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Processes running `/usr/bin/sandboxd` of `root`.
fn installed_daemons(root: &PackageRoot) -> usize {
    let exe = std::fs::metadata(root.path("/usr/bin/sandboxd")).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::metadata(e.path().join("exe"))
                .map(|m| m.dev() == exe.dev() && m.ino() == exe.ino())
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy tier: packages and installs; `cargo test --test it -- --ignored` (.ci/run runs it)"]
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
        "unshare",
        "nsenter",
    ] {
        if !require_tool(
            tool,
            "apt-get install dpkg init-system-helpers systemd util-linux",
        ) {
            return;
        }
    }
    // The host's package database is the lower layer of the test's root:
    // an installed package would be upgraded there, not installed.
    assert!(
        !host_dpkg_status().contains("installed") && !host_dpkg_status().contains("config-files"),
        "sandboxd is installed on this machine ({}): this test installs the package (in a root \
         of its own), so it runs only where the package is absent",
        host_dpkg_status()
    );
    // The host's state directory (README's first command makes one) is
    // neither read nor written; checked at the end.
    let host_state = host_state_dir();
    let host_before = host_paths();

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
    ok(Command::new(&cargo)
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", stage.path())
        .args(["deb", "--no-build", "--fast", "--strip", "--output"])
        .arg(&out_dir));
    let deb = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("cargo deb made no .deb");

    let root = PackageRoot::new();
    assert!(
        !root.exists("/var/lib/sandboxd"),
        "the test's root shows a /var/lib/sandboxd before the install"
    );

    // Install: files, modes, units, enabled and not started.
    let install = ok(root.cmd("dpkg").arg("-i").arg(&deb));
    assert!(install.contains("enabled, not started"), "{install}");
    assert!(
        root.dpkg_status().ends_with("installed"),
        "{}",
        root.dpkg_status()
    );
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
        let meta = root.meta(p);
        assert_eq!(meta.permissions().mode() & 0o7777, m, "mode of {p}");
        assert_eq!(meta.uid(), 0, "owner of {p}");
    }
    let man = std::fs::read_dir(root.path("/usr/share/man/man1"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sandboxd"))
        .count();
    assert!(man >= 5, "{man} sandboxd man pages installed");
    assert_eq!(
        std::fs::read_to_string(root.path("/etc/sandboxd/config.toml")).unwrap(),
        generated(&["config", "default"])
    );
    let conffiles = ok(root
        .cmd("dpkg-query")
        .args(["-W", "-f=${Conffiles}", "sandboxd"]));
    assert!(
        conffiles.contains("/etc/sandboxd/config.toml"),
        "{conffiles}"
    );

    let verify = run(root.cmd("systemd-analyze").args([
        "verify",
        "/usr/lib/systemd/system/sandboxd.service",
        "/usr/lib/systemd/system/sandboxd.socket",
    ]));
    assert!(
        verify.status.success(),
        "systemd-analyze verify of the installed units failed"
    );
    let version = ok(root.cmd("/usr/bin/sandboxd").arg("--version"));
    assert!(
        version.starts_with(&format!("sandboxd {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    ok(root.cmd("/usr/bin/sandboxd").args(["seccomp", "check"]));
    assert!(
        root.exists("/etc/systemd/system/multi-user.target.wants/sandboxd.service"),
        "the service is not enabled"
    );
    assert!(
        !root.exists("/etc/systemd/system/sockets.target.wants/sandboxd.socket"),
        "the optional socket unit was enabled"
    );
    assert_eq!(
        installed_daemons(&root),
        0,
        "the install started the daemon"
    );

    // The installed daemon finds its launcher and agent in
    // /usr/libexec/sandboxd and creates a sandbox with them (its state,
    // user data, cgroup parent and nftables table are this test's own).
    {
        let dirs = NativeDirs::new();
        let d = Daemon::start_native_command(
            root.cmd("/usr/bin/sandboxd"),
            &dirs,
            tempfile::tempdir().unwrap(),
            &[("SANDBOXD_NETWORK", "none")],
            "127.0.0.1:0",
        );
        assert_eq!(
            installed_daemons(&root),
            1,
            "the daemon is not the installed one"
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
    std::fs::write(root.path("/var/lib/sandboxd/keep-me"), "user data").unwrap();
    let remove = run(root.cmd("dpkg").args(["--remove", "sandboxd"]));
    assert!(remove.status.success());
    let said = String::from_utf8_lossy(&remove.stdout).into_owned()
        + &String::from_utf8_lossy(&remove.stderr);
    assert!(said.contains("kept /var/lib/sandboxd"), "{said}");
    assert_eq!(root.dpkg_status(), "deinstall ok config-files");
    assert!(!root.exists("/usr/bin/sandboxd"));
    assert!(!root.exists("/usr/libexec/sandboxd/sandbox-init"));
    assert_eq!(
        std::fs::read_to_string(root.path("/var/lib/sandboxd/keep-me")).unwrap(),
        "user data"
    );
    assert_eq!(
        root.meta("/var/lib/sandboxd").permissions().mode() & 0o7777,
        0o700
    );
    assert!(root.exists("/etc/sandboxd/config.toml"));

    // Purge: everything goes, with a message.
    let purge = run(root.cmd("dpkg").args(["--purge", "sandboxd"]));
    assert!(purge.status.success());
    let said = String::from_utf8_lossy(&purge.stdout).into_owned()
        + &String::from_utf8_lossy(&purge.stderr);
    assert!(said.contains("deleting /var/lib/sandboxd"), "{said}");
    assert_eq!(root.dpkg_status(), "");
    for gone in [
        "/var/lib/sandboxd",
        "/etc/sandboxd",
        "/usr/libexec/sandboxd",
        "/usr/share/sandboxd",
        "/usr/lib/systemd/system/sandboxd.service",
        "/etc/systemd/system/multi-user.target.wants/sandboxd.service",
        "/etc/systemd/system/sandboxd.service",
    ] {
        assert!(!root.exists(gone), "{gone} is left after the purge");
    }
    drop(root);

    // The host saw none of it.
    assert_eq!(
        host_state_dir(),
        host_state,
        "the host's /var/lib/sandboxd changed"
    );
    assert_eq!(host_dpkg_status(), "", "the package is on the host");
    assert_eq!(
        host_paths(),
        host_before,
        "the package left files on the host"
    );
}
