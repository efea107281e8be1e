//! Cross-check with software nobody here wrote: the profile, written
//! verbatim into an OCI bundle's `config.json` (`linux.seccomp`, comments
//! included), is accepted by runc, and the seccomp probe inside the runc
//! container sees the same errnos as under sandboxd's own filter.
//!
//! The one tolerated difference: a syscall newer than the host's libseccomp
//! is unknown to runc, which skips the name, so it gets the default ENOSYS
//! instead of EPERM (still denied). Any other failure, and any failure on the
//! allowed side of an argument rule, fails the test.
//!
//! Needs root, runc and cc; skips loudly without them (fails under CI
//! without cc or runc when running as root).

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::Path;
use std::process::Command;

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

/// Root, runc and cc; without them a failure under `CI=true`, a loud skip
/// elsewhere.
fn prerequisites() -> bool {
    crate::common::privileged("runc_accepts_the_profile_and_the_probe_agrees")
        && crate::common::require_tool("runc", "apt-get install runc")
        && crate::common::require_tool("cc", "apt-get install gcc libc6-dev")
}

fn make_bundle(bundle: &Path) {
    let rootfs = bundle.join("rootfs");
    for d in ["usr", "proc", "dev", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, rootfs.join(link)).unwrap();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probe/seccomp_probe.c");
    let o = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(rootfs.join("probe"))
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let list = Command::new(SANDBOXD)
        .args(["seccomp", "expect"])
        .output()
        .unwrap();
    assert!(list.status.success());
    std::fs::write(rootfs.join("list"), &list.stdout).unwrap();

    let o = Command::new("runc")
        .arg("spec")
        .current_dir(bundle)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "runc spec: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let path = bundle.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["root"] = serde_json::json!({"path": "rootfs", "readonly": true});
    c["process"]["terminal"] = false.into();
    c["process"]["args"] = serde_json::json!(["/probe", "/list"]);
    c["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    c["process"]["noNewPrivileges"] = true.into();
    for set in c["process"]["capabilities"]
        .as_object_mut()
        .unwrap()
        .values_mut()
    {
        *set = serde_json::json!([]);
    }
    c["mounts"].as_array_mut().unwrap().push(serde_json::json!({
        "destination": "/usr", "type": "bind", "source": "/usr",
        "options": ["rbind", "ro", "nosuid", "nodev"]
    }));
    c["linux"]["namespaces"] = serde_json::json!([
        {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}
    ]);
    let (profile, _) = sandboxd::seccomp::load_profile(None).unwrap();
    c["linux"]["seccomp"] = profile.to_oci_value();
    std::fs::write(&path, serde_json::to_string_pretty(&c).unwrap()).unwrap();
}

#[test]
fn runc_accepts_the_profile_and_the_probe_agrees() {
    if !prerequisites() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    make_bundle(&bundle);
    let id = format!("sandboxd-seccomp-test-{}", std::process::id());
    let out = Command::new("runc")
        .arg("--root")
        .arg(dir.path().join("state"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let summary = text.lines().find(|l| l.starts_with("summary:"));
    assert!(
        summary.is_some(),
        "probe did not run under runc: {}",
        out.status
    );
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    for f in &fails {
        assert!(
            f.starts_with("FAIL list ") && f.contains("errno=38(ENOSYS) want=EPERM"),
            "runc/libseccomp disagrees with sandboxd's filter: {f}"
        );
    }
    assert!(
        fails.len() <= 5,
        "too many unknown-to-libseccomp syscalls: {fails:?}"
    );
    assert!(text.lines().filter(|l| l.starts_with("ok ")).count() > 150);
}
