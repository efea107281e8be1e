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

use crate::common::probe;

use std::path::Path;
use std::process::{Command, Output};

use probe::{assert_default_profile_enforced, build_probe, write_expectations};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

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
    assert_default_profile_enforced(&text);
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

#[test]
fn ping_sockets_work_where_ping_group_range_allows_them() {
    // The filter allows ping sockets; whether the kernel grants one depends
    // on net.ipv4.ping_group_range (default "1 0": nobody, hence EACCES in
    // the other runs). In a network namespace of its own, where the range
    // covers every group, the probe must get the socket. Root only (a new
    // network namespace); the host's own setting is not touched.
    if !crate::common::privileged("ping_sockets_work_where_ping_group_range_allows_them") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(probe) = build_probe(dir.path()) else {
        return;
    };
    let list = write_expectations(dir.path(), None);
    let o = Command::new("unshare")
        .args(["--net", "--", "sh", "-c"])
        .arg(
            "echo '0 2147483647' > /proc/sys/net/ipv4/ping_group_range && \
             exec \"$0\" seccomp run -- \"$1\" \"$2\"",
        )
        .arg(SANDBOXD)
        .arg(&probe)
        .arg(&list)
        .output()
        .expect("run unshare");
    let text = String::from_utf8_lossy(&o.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "probe reported failures");
    for family in [
        "AF_INET, SOCK_DGRAM, IPPROTO_ICMP",
        "AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6",
    ] {
        let prefix = format!("ok arg socket({family}) allowed (ping socket) ret=");
        let line = text.lines().find(|l| l.starts_with(&prefix));
        assert!(
            line.is_some_and(|l| !l.starts_with(&format!("{prefix}-1"))
                && l.ends_with("want=success (ping_group_range includes our group)")),
            "no ping socket for {family}:\n{text}"
        );
    }
    assert_default_profile_enforced(&text);
}
