//! How many seccomp filters a sandbox runs under when the daemon runs under
//! the shipped `systemd/sandboxd.service` (docs/security.md, "Seccomp filters
//! under systemd"): the unit's only seccomp-backed directive is
//! `RestrictRealtime=yes`, and systemd installs its filter once per
//! architecture the host can run (x86, x32, x86_64), all inherited by the
//! daemon's descendants.
//!
//! Without systemd as PID 1 the unit cannot be started here, so the
//! directive's filters are installed by systemd's own code
//! (`seccomp_restrict_realtime_full` in `libsystemd-shared`, called by
//! `tests/probe/systemd_filters.c`) and the count is read from
//! `/proc/self/status`, as an operator would on a node.

use std::path::{Path, PathBuf};
use std::process::Command;

const SANDBOXD: &str = env!("CARGO_BIN_EXE_sandboxd");

/// systemd directives that make the service manager install a seccomp
/// filter (systemd 252, `src/core/execute.c`).
const SECCOMP_DIRECTIVES: [&str; 15] = [
    "SystemCallFilter",
    "SystemCallArchitectures",
    "SystemCallLog",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectKernelTunables",
    "ProtectClock",
    "ProtectHostname",
    "PrivateDevices",
];

#[test]
fn the_shipped_unit_sets_only_restrict_realtime_among_seccomp_directives() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/sandboxd.service"),
    )
    .unwrap();
    let set: Vec<&str> = unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split_once('=')
                .is_some_and(|(k, _)| SECCOMP_DIRECTIVES.contains(&k.trim()))
        })
        .collect();
    assert_eq!(
        set,
        ["RestrictRealtime=yes"],
        "the unit's seccomp directives changed: update docs/security.md \
         (Seccomp filters under systemd) and this test"
    );
}

fn libsystemd_shared() -> Option<PathBuf> {
    for dir in [
        "/usr/lib/x86_64-linux-gnu/systemd",
        "/lib/x86_64-linux-gnu/systemd",
        "/usr/lib/systemd",
        "/lib/systemd",
    ] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("libsystemd-shared-") && name.ends_with(".so") {
                return Some(e.path());
            }
        }
    }
    None
}

fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}; CI provides it, so this is a failure");
    }
    eprintln!("\n*** SKIPPED {test}: {why} ***\n");
}

#[test]
fn restrict_realtime_adds_three_filters_that_sandboxes_inherit() {
    let test = "restrict_realtime_adds_three_filters_that_sandboxes_inherit";
    // Without no_new_privs (systemd does not set it for these filters)
    // loading a filter needs CAP_SYS_ADMIN.
    if !nix::unistd::Uid::effective().is_root() {
        return skip(test, "needs root");
    }
    let Some(lib) = libsystemd_shared() else {
        return skip(test, "no libsystemd-shared (apt-get install systemd)");
    };
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("systemd_filters");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probe/systemd_filters.c");
    let Ok(o) = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&helper)
        .arg(&src)
        .arg("-ldl")
        .output()
    else {
        return skip(test, "no C compiler (cc)");
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let filters = |cmd: &[&str]| {
        let o = Command::new(&helper).arg(&lib).args(cmd).output().unwrap();
        assert!(
            o.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let grep = ["grep", "^Seccomp_filters:", "/proc/self/status"];
    // The daemon under the unit.
    assert_eq!(filters(&grep), "Seccomp_filters:\t3\n");
    // A sandbox: those three plus the four sandbox-init installs (the same
    // stack `seccomp run` installs).
    let mut sandbox = vec![SANDBOXD, "seccomp", "run", "--"];
    sandbox.extend(grep);
    assert_eq!(filters(&sandbox), "Seccomp_filters:\t7\n");
}
