//! Evidence that the compiled filter does what the profile says, on the real
//! kernel: `tests/probe/seccomp_probe.c` is built with `cc` and run under
//! `sandboxd seccomp run`; it issues every call the profile denies (the list
//! comes from `sandboxd seccomp expect`, so it cannot drift from the profile)
//! and both sides of every argument rule, and checks the exact errno.
//!
//! Needs x86_64 Linux and a C compiler; no privileges (no_new_privs makes
//! seccomp available to anyone). Without `cc` it skips loudly, or fails when
//! `CI` is set.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sandboxd::seccomp::{audit, load_profile};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

fn build_probe(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probe/seccomp_probe.c");
    let out = dir.join("seccomp_probe");
    if Command::new("cc").arg("--version").output().is_err() {
        if std::env::var_os("CI").is_some() {
            panic!("cc is required under CI to build the seccomp probe");
        }
        eprintln!("SKIP: no C compiler (cc) on this host; the seccomp probe cannot be built");
        return None;
    }
    // Static if the host has a static libc, so the same binary can later run
    // inside a sandbox whose rootfs has no compiler or matching libc.
    for static_flag in [true, false] {
        let mut c = Command::new("cc");
        c.args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(&src);
        if static_flag {
            c.arg("-static");
        }
        let o = c.output().expect("run cc");
        if o.status.success() {
            return Some(out);
        }
        eprintln!(
            "cc (static={static_flag}) failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    panic!("the seccomp probe does not compile");
}

fn write_expectations(dir: &Path, profile: Option<&Path>) -> PathBuf {
    let mut c = Command::new(SANDBOXD);
    c.args(["seccomp", "expect"]);
    if let Some(p) = profile {
        c.arg("--profile").arg(p);
    }
    let o = c.output().expect("run sandboxd seccomp expect");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let list = dir.join("expected-denials.txt");
    std::fs::write(&list, &o.stdout).unwrap();
    list
}

fn run_probe(probe: &Path, list: &Path, profile: Option<&Path>) -> (Output, String) {
    let mut c = Command::new(SANDBOXD);
    c.args(["seccomp", "run"]);
    if let Some(p) = profile {
        c.arg("--profile").arg(p);
    }
    let o = c
        .arg("--")
        .arg(probe)
        .arg(list)
        .output()
        .expect("run probe");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&o.stderr));
    (o, text)
}

#[test]
fn probe_passes_under_the_default_profile() {
    let dir = tempfile::tempdir().unwrap();
    let Some(probe) = build_probe(dir.path()) else {
        return;
    };
    let list = write_expectations(dir.path(), None);
    let (out, text) = run_probe(&probe, &list, None);
    assert_eq!(out.status.code(), Some(0), "probe reported failures");
    assert!(!text.contains("FAIL"), "{text}");

    // Every expected denial from the profile was actually issued and checked.
    let (profile, _) = load_profile(None).unwrap();
    let expected = audit::expectations(&profile).unwrap();
    assert!(expected.len() > 100, "suspiciously few expectations");
    for e in &expected {
        if e.name == "uprobe" || e.name == "uretprobe" {
            continue;
        }
        let line = format!("ok list {}({}) ", e.name, e.nr);
        assert!(text.contains(&line), "no check for {} ({line:?})", e.name);
    }
    for name in [
        "ptrace",
        "mount",
        "bpf",
        "io_uring_setup",
        "keyctl",
        "unshare",
        "clone3",
    ] {
        assert!(
            text.contains(&format!("ok list {name}(")),
            "{name} not probed"
        );
    }

    // Both sides of every argument rule of the profile were exercised.
    for name in audit::conditional_syscalls(&profile).unwrap() {
        let allowed = format!("ok arg {name}(");
        let sides: Vec<&str> = text.lines().filter(|l| l.starts_with(&allowed)).collect();
        assert!(
            sides.iter().any(|l| l.contains(") allowed")),
            "no allowed-side check for {name}"
        );
        assert!(
            sides.iter().any(|l| l.contains(") denied")),
            "no denied-side check for {name}"
        );
    }

    let summary = text
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary");
    assert!(summary.ends_with(", 0 failures"), "{summary}");
}

#[test]
fn probe_notices_a_weaker_profile() {
    // Drop the ptrace denial: ptrace falls to the default (ENOSYS), which the
    // probe, still expecting EPERM from the default profile, must report.
    let dir = tempfile::tempdir().unwrap();
    let Some(probe) = build_probe(dir.path()) else {
        return;
    };
    let list = write_expectations(dir.path(), None);
    let mut v: serde_json::Value =
        serde_json::from_str(sandboxd::seccomp::DEFAULT_PROFILE).unwrap();
    v["syscalls"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["names"] != serde_json::json!(["ptrace"]));
    let weak = dir.path().join("weak.json");
    std::fs::write(&weak, serde_json::to_string(&v).unwrap()).unwrap();

    let (out, text) = run_probe(&probe, &list, Some(&weak));
    assert_eq!(out.status.code(), Some(1), "probe should have failed");
    assert!(text.contains("FAIL list ptrace(101)"), "{text}");
    assert!(
        text.contains("summary:") && text.contains(", 1 failures"),
        "{text}"
    );
}

#[test]
fn probe_refuses_to_run_without_a_filter() {
    let dir = tempfile::tempdir().unwrap();
    let Some(probe) = build_probe(dir.path()) else {
        return;
    };
    let out = Command::new(&probe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("FAIL gate"), "{text}");
}
