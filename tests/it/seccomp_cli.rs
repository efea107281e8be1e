//! The auditor CLI end to end: `diff` against Docker's default profile (the
//! cross-check against software nobody here wrote), `check`, `table`, and
//! fail-closed behaviour on a bad profile.
//!
//! Docker's profile is the copy kept in `seccomp/reference/` (see its
//! README for origin and version); its absence is a failure, not a skip.

use std::path::PathBuf;
use std::process::{Command, Output};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

fn docker_reference() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seccomp/reference/docker-default.json");
    assert!(
        p.exists(),
        "Docker's reference profile is missing at {}",
        p.display()
    );
    p
}

fn sandboxd(args: &[&str]) -> (Output, String) {
    let out = Command::new(SANDBOXD).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    (out, text)
}

/// The lines of one section of the diff output.
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(title))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect()
}

#[test]
fn diff_against_docker_we_allow_they_deny_is_empty() {
    let docker = docker_reference();
    let (out, text) = sandboxd(&["seccomp", "diff", "--against", docker.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("we allow, they deny: 0"), "{text}");
    assert_eq!(section(&text, "we allow, they deny:"), ["  (none)"]);
    let stricter = section(&text, "we deny, they allow:").join("\n");
    for name in [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "modify_ldt",
        "ioctl",
        "socket",
        "socketpair",
    ] {
        assert!(
            stricter.contains(name),
            "{name} not in 'we deny, they allow':\n{stricter}"
        );
    }
}

#[test]
fn diff_defaults_to_the_embedded_docker_reference() {
    let docker = docker_reference();
    let (out, text) = sandboxd(&["seccomp", "diff"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text.contains("seccomp/reference/docker-default.json"),
        "{text}"
    );
    let (_, explicit) = sandboxd(&["seccomp", "diff", "--against", docker.to_str().unwrap()]);
    // Same verdict line for line, apart from the header naming the source.
    let body = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&text), body(&explicit));
}

#[test]
fn diff_exits_non_zero_when_we_are_looser() {
    let docker = docker_reference();
    let mut v: serde_json::Value =
        serde_json::from_str(sandboxd::seccomp::DEFAULT_PROFILE).unwrap();
    for e in v["syscalls"].as_array_mut().unwrap() {
        if e["names"] == serde_json::json!(["keyctl", "add_key", "request_key"]) {
            e["action"] = "SCMP_ACT_ALLOW".into();
            e.as_object_mut().unwrap().remove("errnoRet");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let loose = dir.path().join("loose.json");
    std::fs::write(&loose, v.to_string()).unwrap();
    let (out, text) = sandboxd(&[
        "seccomp",
        "diff",
        "--profile",
        loose.to_str().unwrap(),
        "--against",
        docker.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let looser = section(&text, "we allow, they deny:").join("\n");
    assert!(
        looser.contains("keyctl") && looser.contains("add_key"),
        "{text}"
    );
}

#[test]
fn check_passes_and_counts_instructions() {
    let (out, text) = sandboxd(&["seccomp", "check"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text.contains("filter allow-list (default ENOSYS):"),
        "{text}"
    );
    assert!(text.contains("filter deny (EPERM):"), "{text}");
    assert!(text.contains("filter deny (EAFNOSUPPORT):"), "{text}");
    assert!(text.contains("filter deny (EPROTONOSUPPORT):"), "{text}");
    assert!(text.contains("0 problem(s)"), "{text}");
}

#[test]
fn table_lists_every_number() {
    let (out, text) = sandboxd(&["seccomp", "table"]);
    assert!(out.status.success());
    let max = sandboxd::seccomp::syscalls::MAX_NR as usize;
    assert_eq!(text.lines().count(), max + 1);
    let ptrace = text.lines().find(|l| l.contains(" ptrace ")).unwrap();
    assert!(
        ptrace.contains("EPERM") && ptrace.contains("[debugging]"),
        "{ptrace}"
    );
}

#[test]
fn a_bad_profile_fails_closed_with_file_entry_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":38,"syscalls":[
            {"names":["read","write","exit_group"],"action":"SCMP_ACT_ALLOW"},
            {"names":["no_such_syscall"],"action":"SCMP_ACT_ERRNO","errnoRet":1}]}"#,
    )
    .unwrap();
    let marker = dir.path().join("ran");
    let (out, _) = sandboxd(&[
        "seccomp",
        "run",
        "--profile",
        bad.to_str().unwrap(),
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!marker.exists(), "the command ran despite the bad profile");
    assert!(stderr.contains("bad.json"), "{stderr}");
    assert!(stderr.contains("syscalls[1] (no_such_syscall)"), "{stderr}");
    assert!(stderr.contains("unknown syscall name"), "{stderr}");

    let (out, text) = sandboxd(&["seccomp", "check", "--profile", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("problem: ") && text.contains("no_such_syscall"),
        "{text}"
    );
}

#[test]
fn reviewer_doc_denial_table_matches_the_profile() {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/seccomp.md"))
            .unwrap();
    let start = doc.find("<!-- BEGIN GENERATED DENIALS -->\n").unwrap();
    let body = &doc[start..];
    let body =
        &body[body.find('\n').unwrap() + 1..body.find("<!-- END GENERATED DENIALS -->").unwrap()];
    let (out, text) = sandboxd(&["seccomp", "table", "--denied", "--markdown"]);
    assert!(out.status.success());
    assert_eq!(
        body, text,
        "docs/seccomp.md is stale: regenerate its denial table with \
         `sandboxd seccomp table --denied --markdown`"
    );
}
