//! `GET /v1/sandbox`: health and the context the client's `get_context()`
//! parses (top-level `home_dir`, `version`, `detail`; the same object is also
//! the envelope's `data`).
//!
//! Everything is computed cheaply without running programs: `/etc/os-release`,
//! `uname`, the passwd entry, a `PATH` scan; cached after the first call.
//! Only `occupied_ports` (from `/proc/net/tcp{,6}`) is read every time.
//!
//! Owns: describing the sandbox. Must not change anything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// Tools reported under `utils` when found on `PATH`.
const UTILS: &[(&str, &[&str])] = &[
    ("shell", &["bash", "sh"]),
    (
        "file",
        &[
            "ls", "cat", "find", "grep", "sed", "awk", "tar", "gzip", "unzip", "zip",
        ],
    ),
    ("network", &["curl", "wget"]),
    (
        "development",
        &["git", "make", "gcc", "pip", "pip3", "npm", "uv"],
    ),
];

/// The name of `uid` in `/etc/passwd` (what glibc's `files` source, the
/// only one a static binary in a sandbox has, would answer).
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd_name(&passwd, uid)
}

fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let found: u32 = fields.next()?.parse().ok()?;
        (found == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// Static part of the context, computed once.
fn static_context(home: &Path, workspace: &Path) -> &'static Value {
    static CONTEXT: OnceLock<Value> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        let uname = rustix::system::uname();
        let uid = rustix::process::getuid().as_raw();
        let user = user_name(uid)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| uid.to_string());
        let home_dir = home.display().to_string();
        let workspace = workspace.display().to_string();
        let utils: Vec<Value> = UTILS
            .iter()
            .filter_map(|(category, names)| {
                let tools: Vec<Value> = names
                    .iter()
                    .filter_map(|n| {
                        which(n).map(|p| json!({"name": n, "description": p.display().to_string()}))
                    })
                    .collect();
                (!tools.is_empty()).then(|| json!({"category": category, "tools": tools}))
            })
            .collect();
        json!({
            "home_dir": home_dir,
            "workspace": workspace,
            "version": env!("CARGO_PKG_VERSION"),
            "detail": {
                "system": {
                    "os": uname.sysname().to_string_lossy(),
                    "os_version": os_version(&uname.release().to_string_lossy()),
                    "arch": uname.machine().to_string_lossy(),
                    "user": user,
                    "home_dir": home_dir,
                    "workspace": workspace,
                    "timezone": timezone(),
                    "occupied_ports": [],
                },
                "runtime": {
                    "python": runtimes(&["python3", "python"], "python"),
                    "nodejs": runtimes(&["node", "nodejs"], "node"),
                },
                "utils": utils,
            }
        })
    })
}

/// The full context value with fresh `occupied_ports`; `workspace` is the
/// agent's working directory.
pub fn context(home: &Path, workspace: &Path) -> Value {
    let mut v = static_context(home, workspace).clone();
    v["detail"]["system"]["occupied_ports"] = json!(occupied_ports());
    v
}

/// `PRETTY_NAME` from os-release, else the kernel release.
fn os_version(kernel: &str) -> String {
    ["/etc/os-release", "/usr/lib/os-release"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|text| os_release_field(&text, "PRETTY_NAME"))
        .unwrap_or_else(|| kernel.to_owned())
}

pub fn os_release_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').trim_matches('\'').to_owned())
    })
}

fn timezone() -> String {
    if let Ok(tz) = std::env::var("TZ") {
        if !tz.is_empty() {
            return tz.trim_start_matches(':').to_owned();
        }
    }
    if let Ok(tz) = std::fs::read_to_string("/etc/timezone") {
        if !tz.trim().is_empty() {
            return tz.trim().to_owned();
        }
    }
    std::fs::read_link("/etc/localtime")
        .ok()
        .and_then(|p| {
            let s = p.display().to_string();
            s.split_once("zoneinfo/").map(|(_, z)| z.to_owned())
        })
        .unwrap_or_else(|| "UTC".to_owned())
}

/// The first executable named `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runtimes found on `PATH`; the version is read from the resolved file
/// name (`python3.11` → `3.11`) when it carries one, never by running it.
fn runtimes(names: &[&str], stem: &str) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    names
        .iter()
        .filter_map(|n| which(n))
        .filter_map(|bin| {
            let real = std::fs::canonicalize(&bin).unwrap_or_else(|_| bin.clone());
            if !seen.insert(real.clone()) {
                return None;
            }
            let file = real.file_name()?.to_string_lossy().into_owned();
            let ver = file
                .strip_prefix(stem)
                .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()));
            Some(json!({"ver": ver, "bin": bin.display().to_string(), "alias": [file]}))
        })
        .collect()
}

/// Listening TCP ports (IPv4 and IPv6), as strings, sorted.
fn occupied_ports() -> Vec<String> {
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            ports.extend(listening_ports(&text));
        }
    }
    ports.into_iter().map(|p| p.to_string()).collect()
}

/// Ports in state LISTEN (0A) of a `/proc/net/tcp` table.
pub fn listening_ports(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let local = cols.nth(1)?;
            let state = cols.nth(1)?;
            (state == "0A").then_some(())?;
            u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_come_from_passwd_lines() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      broken line\n\
                      gem:x:1000:1000::/home/gem:/bin/sh\n";
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 1000).as_deref(), Some("gem"));
        assert_eq!(passwd_name(passwd, 4242), None);
    }

    #[test]
    fn parses_proc_net_tcp() {
        let t = "  sl  local_address rem_address   st tx_queue\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n   1: 0100007F:D2C4 0100007F:1F90 01 00000000:00000000\n";
        assert_eq!(listening_ports(t), vec![8080]);
    }

    #[test]
    fn parses_os_release() {
        let t = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(
            os_release_field(t, "PRETTY_NAME").unwrap(),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(os_release_field(t, "ID"), None);
    }

    #[test]
    fn context_has_every_field_the_client_requires() {
        let v = context(Path::new("/home/gem"), Path::new("/home/gem/w"));
        for k in ["home_dir", "version", "detail"] {
            assert!(v.get(k).is_some(), "{k}");
        }
        let s = &v["detail"]["system"];
        for k in [
            "os",
            "os_version",
            "arch",
            "user",
            "home_dir",
            "workspace",
            "timezone",
        ] {
            assert!(s[k].is_string(), "{k}");
        }
        assert!(s["occupied_ports"].is_array());
        assert!(v["detail"]["runtime"]["python"].is_array());
        assert!(v["detail"]["runtime"]["nodejs"].is_array());
        assert!(v["detail"]["utils"].is_array());
    }
}
