//! The seccomp probe (`tests/probe/seccomp_probe.c`): building it, writing
//! its expected-denial list from `sandboxd seccomp expect`, and checking its
//! report. Shared by `tests/seccomp_probe.rs` (under `sandboxd seccomp run`)
//! and `tests/native_seccomp.rs` (inside a real sandbox), so both hold the
//! probe to the same exact-errno expectations.

use std::path::{Path, PathBuf};
use std::process::Command;

use sandboxd::seccomp::{audit, load_profile};

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

/// Builds the probe into `dir`: static if the host has a static libc (so
/// the binary needs nothing from the rootfs it later runs in), dynamic
/// otherwise. `None` (after a loud message) without a C compiler; panics
/// under `CI` without one, or when the source does not compile.
pub fn build_probe(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probe/seccomp_probe.c");
    let out = dir.join("seccomp_probe");
    if !super::require_tool("cc", "apt-get install gcc libc6-dev") {
        return None;
    }
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

/// Writes `sandboxd seccomp expect [--profile P]` to
/// `dir/expected-denials.txt` and returns its path.
pub fn write_expectations(dir: &Path, profile: Option<&Path>) -> PathBuf {
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

/// Asserts that the probe's report (`text`, its whole stdout) shows the
/// default profile enforced exactly: no failure, a check for every expected
/// denial (EPERM or ENOSYS as listed), both sides of every argument rule,
/// and a clean summary. Returns the number of checks from the summary.
pub fn assert_default_profile_enforced(text: &str) -> usize {
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
    // The module-autoloading surface: families, protocols, netlink
    // families and line disciplines, with their exact errnos; the families
    // and protocols a sandbox needs still work.
    for line in [
        "ok arg socket(AF_TIPC) denied ret=-1 errno=97(EAFNOSUPPORT)",
        "ok arg socket(AF_PACKET) denied ret=-1 errno=97(EAFNOSUPPORT)",
        "ok arg socket(AF_ALG) denied ret=-1 errno=97(EAFNOSUPPORT)",
        "ok arg socket(AF_VSOCK) denied ret=-1 errno=97(EAFNOSUPPORT)",
        "ok arg socket(AF_INET, IPPROTO_SCTP) denied ret=-1 errno=93(EPROTONOSUPPORT)",
        "ok arg socket(AF_INET6, IPPROTO_DCCP) denied ret=-1 errno=93(EPROTONOSUPPORT)",
        "ok arg socket(AF_NETLINK, NETLINK_GENERIC) denied ret=-1 errno=93(EPROTONOSUPPORT)",
        "ok arg socket(every domain 0..255 but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK; high bits) denied",
        "ok arg socket(AF_INET, every protocol 0..511 but 0, ICMP, TCP, UDP; high bits) denied",
        "ok arg socket(AF_INET6, every protocol 0..511 but 0, TCP, UDP, ICMPV6; high bits) denied",
        "ok arg socket(AF_NETLINK, every netlink family 0..255 but NETLINK_ROUTE; high bits) denied",
        "ok arg socketpair(every domain 0..255 but AF_UNIX; high bits) denied",
        "ok arg socketpair(AF_INET) denied ret=-1 errno=97(EAFNOSUPPORT)",
        "ok arg ioctl(0, TIOCSETD) denied ret=-1 errno=1(EPERM)",
        "ok arg ioctl(0, 1<<32|TIOCSETD) denied (high bits) ret=-1 errno=1(EPERM)",
        "ok arg socket(AF_UNIX, SOCK_STREAM|SOCK_CLOEXEC, 0) allowed ret=",
        "ok arg socket(AF_UNIX, SOCK_DGRAM, 0) allowed ret=",
        "ok arg socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) allowed ret=",
        "ok arg socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP) allowed ret=",
        "ok arg socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) allowed ret=",
        "ok arg socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP) allowed (ping socket) ret=",
        "ok arg socketpair(AF_UNIX, SOCK_STREAM, 0) allowed ret=0 ",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
    // IPv6 sockets succeed unless the kernel has IPv6 disabled (then the
    // probe says it skipped them).
    assert!(
        text.contains("ok arg socket(AF_INET6, SOCK_STREAM, IPPROTO_TCP) allowed ret=")
            || text.contains(
                "skip arg socket(AF_INET6, SOCK_STREAM, IPPROTO_TCP) allowed: IPv6 is disabled"
            ),
        "{text}"
    );

    // Foreign ABIs are killed: x32 numbers and i386 `int $0x80` (a kernel
    // without ia32 emulation answers that one with SIGSEGV first).
    assert!(
        text.contains("ok nr 0x40000027 (x32 getpid) killed ret=31 errno=0(0) want=SIGSYS\n"),
        "{text}"
    );
    assert!(text.contains("ok i386 int $0x80 getpid killed "), "{text}");

    // Unlisted and out-of-table numbers get the default, ENOSYS.
    for line in [
        "ok nr 400 (unassigned) ENOSYS",
        "ok nr 1000 (beyond the table) ENOSYS",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
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
    summary
        .trim_start_matches("summary: ")
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("check count in the summary")
}
