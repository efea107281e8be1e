//! The device allow-list of a sandbox's cgroup: OCI
//! `linux.resources.devices`, enforced by the v1 `devices` controller on
//! v1 and hybrid hosts and by a BPF device program on pure v2 ones.
//!
//! The rules are applied in their listed order (as the OCI spec requires)
//! on top of an empty list: the cgroup first gets `a` in `devices.deny`
//! (deny everything, drop every exception), so a sandbox can use exactly the
//! devices its rules allow, whatever the parent allows. Access and
//! creation (`mknod`) are both covered (`r`, `w`, `m`), for every process in
//! the cgroup, root with every capability included.
//!
//! cgroup v2 has no devices files: there the kernel checks a BPF program
//! attached to the cgroup (`BPF_CGROUP_DEVICE`). [`DevicePolicy`] is what
//! the v1 controller ends up holding after the same writes (the kernel's
//! rules, emulated), and [`bpf`](super::bpf) turns it into the program, so
//! a sandbox gets the same device policy on v1 and v2 (runc does the same
//! with its v1 emulator).

use std::path::Path;

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};

use super::{files, CgroupError};

/// One write to a v1 devices file: `(file name, line)`.
pub type DeviceWrite = (&'static str, String);

/// Access bits as the kernel numbers them (`BPF_DEVCG_ACC_*`): `m`, `r`, `w`.
pub const ACCESS_MKNOD: u8 = 1;
pub const ACCESS_READ: u8 = 2;
pub const ACCESS_WRITE: u8 = 4;
pub const ACCESS_ALL: u8 = ACCESS_MKNOD | ACCESS_READ | ACCESS_WRITE;

/// A device's type as a rule or exception names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Block,
    Char,
}

/// One rule, checked: `kind` `None` is `a` (every device; the kernel then
/// ignores the numbers and the access), a number `None` is `*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    allow: bool,
    kind: Option<DeviceKind>,
    major: Option<u32>,
    minor: Option<u32>,
    access: u8,
}

fn parse(r: &LinuxDeviceCgroup) -> Result<Rule, CgroupError> {
    let bad = |reason| CgroupError::BadDeviceRule {
        rule: r.to_string(),
        reason,
    };
    let access = r.access().as_deref().unwrap_or("");
    let access = if access.is_empty() { "rwm" } else { access };
    let mut bits = 0;
    for c in access.chars() {
        bits |= match c {
            'm' => ACCESS_MKNOD,
            'r' => ACCESS_READ,
            'w' => ACCESS_WRITE,
            _ => return Err(bad("access must be made of r, w and m")),
        };
    }
    let kind = match r.typ().unwrap_or_default() {
        LinuxDeviceType::A => None,
        LinuxDeviceType::B => Some(DeviceKind::Block),
        LinuxDeviceType::C => Some(DeviceKind::Char),
        LinuxDeviceType::U | LinuxDeviceType::P => {
            return Err(bad("type must be a, b or c (the devices cgroup's types)"))
        }
    };
    let num = |n: Option<i64>| match n {
        None => Ok(None),
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| bad("major and minor must be between 0 and 4294967295")),
    };
    Ok(Rule {
        allow: r.allow(),
        kind,
        major: num(r.major())?,
        minor: num(r.minor())?,
        access: bits,
    })
}

/// The writes that turn a fresh v1 devices cgroup into exactly `rules`:
/// `a` to `devices.deny` first, then each rule in order. An empty access
/// means `rwm` (all of them), as in runc.
pub fn v1_writes(rules: &[LinuxDeviceCgroup]) -> Result<Vec<DeviceWrite>, CgroupError> {
    let mut out = vec![("devices.deny", "a".to_string())];
    for r in rules {
        parse(r)?;
        let access = r.access().as_deref().unwrap_or("");
        let access = if access.is_empty() { "rwm" } else { access };
        let num = |n: Option<i64>| n.map_or_else(|| "*".to_string(), |n| n.to_string());
        let line = format!(
            "{} {}:{} {access}",
            r.typ().unwrap_or_default().as_str(),
            num(r.major()),
            num(r.minor()),
        );
        let file = if r.allow() {
            "devices.allow"
        } else {
            "devices.deny"
        };
        out.push((file, line));
    }
    Ok(out)
}

/// Applies `rules` to the v1 devices cgroup directory `dir`.
pub(crate) fn apply_v1(dir: &Path, rules: &[LinuxDeviceCgroup]) -> Result<(), CgroupError> {
    for (file, line) in v1_writes(rules)? {
        files::write(&dir.join(file), &line)?;
    }
    Ok(())
}

/// An exception of a [`DevicePolicy`]: devices of `kind` with these
/// numbers (`None`: any), and the access bits it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceException {
    pub kind: DeviceKind,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: u8,
}

/// What a v1 devices cgroup holds after [`v1_writes`]: a default
/// (`devices.list` shows `a *:* rwm` when it is allow) and the exceptions
/// to it, computed as the kernel does (`devcgroup_update_access`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePolicy {
    pub default_allow: bool,
    pub exceptions: Vec<DeviceException>,
}

impl DevicePolicy {
    /// Applies `a` to `devices.deny`, then `rules` in order, as the v1
    /// controller does: an `a` rule sets the default and drops every
    /// exception (its numbers and access are ignored); a rule that goes
    /// against the default adds an exception (merging its access into one
    /// with the same type and numbers); a rule that agrees with it takes
    /// its access away from the exception with exactly the same type and
    /// numbers (a wildcard rule does not touch narrower exceptions),
    /// dropping it when nothing is left.
    pub fn from_rules(rules: &[LinuxDeviceCgroup]) -> Result<DevicePolicy, CgroupError> {
        let mut p = DevicePolicy {
            default_allow: false,
            exceptions: Vec::new(),
        };
        for r in rules {
            let r = parse(r)?;
            let Some(kind) = r.kind else {
                p.default_allow = r.allow;
                p.exceptions.clear();
                continue;
            };
            let same =
                |e: &DeviceException| e.kind == kind && e.major == r.major && e.minor == r.minor;
            if r.allow != p.default_allow {
                match p.exceptions.iter_mut().find(|e| same(e)) {
                    Some(e) => e.access |= r.access,
                    None => p.exceptions.push(DeviceException {
                        kind,
                        major: r.major,
                        minor: r.minor,
                        access: r.access,
                    }),
                }
            } else {
                for e in p.exceptions.iter_mut().filter(|e| same(e)) {
                    e.access &= !r.access;
                }
                p.exceptions.retain(|e| e.access != 0);
            }
        }
        Ok(p)
    }

    /// Whether a process may have `access` (bits) to the device `kind`
    /// `major:minor`, as the v1 controller decides: with a default of deny,
    /// one exception must match and cover every bit asked for; with a
    /// default of allow, no exception may match with a bit in common.
    pub fn allows(&self, kind: DeviceKind, major: u32, minor: u32, access: u8) -> bool {
        let matches = |e: &&DeviceException| {
            e.kind == kind
                && e.major.is_none_or(|m| m == major)
                && e.minor.is_none_or(|m| m == minor)
        };
        if self.default_allow {
            !self
                .exceptions
                .iter()
                .filter(matches)
                .any(|e| e.access & access != 0)
        } else {
            self.exceptions
                .iter()
                .filter(matches)
                .any(|e| access & !e.access == 0)
        }
    }
}

/// Attaches `program` (loaded from [`DevicePolicy`] of the rules) to the
/// v2 cgroup directory `dir`. Call before any process joins.
pub(crate) fn apply_v2(dir: &Path, program: &std::os::fd::OwnedFd) -> Result<(), CgroupError> {
    super::bpf::attach(dir, program).map_err(|e| CgroupError::DeviceProgram(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxDeviceCgroupBuilder, LinuxDeviceType};

    fn rule(
        allow: bool,
        typ: Option<LinuxDeviceType>,
        mm: Option<(i64, i64)>,
        access: &str,
    ) -> LinuxDeviceCgroup {
        let mut b = LinuxDeviceCgroupBuilder::default().allow(allow);
        if let Some(t) = typ {
            b = b.typ(t);
        }
        if let Some((major, minor)) = mm {
            b = b.major(major).minor(minor);
        }
        if !access.is_empty() {
            b = b.access(access);
        }
        b.build().unwrap()
    }

    #[test]
    fn starts_from_deny_all_and_keeps_the_order() {
        let rules = [
            rule(false, None, None, "rwm"),
            rule(true, Some(LinuxDeviceType::C), Some((1, 3)), "rwm"),
            rule(true, Some(LinuxDeviceType::C), Some((5, 2)), ""),
            rule(false, Some(LinuxDeviceType::C), Some((1, 3)), "m"),
        ];
        let w = v1_writes(&rules).unwrap();
        let w: Vec<(&str, &str)> = w.iter().map(|(f, l)| (*f, l.as_str())).collect();
        assert_eq!(
            w,
            [
                ("devices.deny", "a"),
                ("devices.deny", "a *:* rwm"),
                ("devices.allow", "c 1:3 rwm"),
                ("devices.allow", "c 5:2 rwm"),
                ("devices.deny", "c 1:3 m"),
            ]
        );
    }

    #[test]
    fn a_wildcard_minor_and_an_empty_list() {
        let mut r = rule(true, Some(LinuxDeviceType::C), None, "rwm");
        r.set_major(Some(136));
        let w = v1_writes(&[r]).unwrap();
        assert_eq!(w[1], ("devices.allow", "c 136:* rwm".to_string()));
        // No rules: no device at all.
        assert_eq!(v1_writes(&[]).unwrap(), [("devices.deny", "a".to_string())]);
    }

    #[test]
    fn refuses_bad_access() {
        let r = rule(true, Some(LinuxDeviceType::C), Some((1, 3)), "rwx");
        let e = v1_writes(&[r]).unwrap_err().to_string();
        assert!(e.contains("c 1:3 rwx") && e.contains("r, w and m"), "{e}");
    }

    fn c(major: i64, minor: Option<i64>, access: &str, allow: bool) -> LinuxDeviceCgroup {
        let mut r = rule(allow, Some(LinuxDeviceType::C), None, access);
        r.set_major(Some(major));
        r.set_minor(minor);
        r
    }

    const RW: u8 = ACCESS_READ | ACCESS_WRITE;

    /// The shipped base spec's list: deny all, then eight char devices.
    #[test]
    fn the_base_specs_policy() {
        let base: oci_spec::runtime::Spec =
            serde_json::from_str(include_str!("../../../oci/base.json")).unwrap();
        let rules = base.linux().as_ref().unwrap().resources().as_ref().unwrap();
        let p = DevicePolicy::from_rules(rules.devices().as_ref().unwrap()).unwrap();
        assert!(!p.default_allow);
        assert_eq!(p.exceptions.len(), 8);
        let char_ok = |ma, mi, acc| p.allows(DeviceKind::Char, ma, mi, acc);
        assert!(char_ok(1, 3, RW) && char_ok(1, 3, ACCESS_MKNOD) && char_ok(1, 9, ACCESS_READ));
        assert!(char_ok(136, 0, RW) && char_ok(136, 4095, RW) && char_ok(5, 2, RW));
        assert!(!char_ok(10, 200, ACCESS_READ), "tun");
        assert!(!char_ok(1, 1, ACCESS_READ), "/dev/mem");
        assert!(!char_ok(5, 1, RW), "/dev/console");
        assert!(
            !p.allows(DeviceKind::Block, 1, 3, ACCESS_READ),
            "the type counts"
        );
        assert!(!p.allows(DeviceKind::Block, 8, 0, ACCESS_MKNOD));
    }

    /// The v1 controller's rules (devcgroup_update_access): exceptions
    /// merge, a rule agreeing with the default removes access bits from
    /// the exception with exactly its numbers (a wildcard one does not
    /// reach narrower ones), and `a` resets.
    #[test]
    fn emulates_the_v1_controller() {
        let p = DevicePolicy::from_rules(&[
            c(1, Some(3), "r", true),
            c(1, Some(3), "w", true),
            c(1, Some(5), "rwm", true),
            c(1, Some(5), "m", false),
            c(1, None, "rwm", false),
            c(4, None, "rw", true),
            c(4, Some(1), "rwm", false),
        ])
        .unwrap();
        assert!(!p.default_allow);
        assert!(p.allows(DeviceKind::Char, 1, 3, RW), "merged r and w");
        assert!(!p.allows(DeviceKind::Char, 1, 3, ACCESS_MKNOD));
        assert!(p.allows(DeviceKind::Char, 1, 5, RW));
        assert!(
            !p.allows(DeviceKind::Char, 1, 5, ACCESS_MKNOD),
            "m taken away"
        );
        assert!(
            p.allows(DeviceKind::Char, 4, 1, ACCESS_READ),
            "a narrower deny does not punch a hole into a wildcard exception (v1 does not either)"
        );
        // Default allow: exceptions deny on any common bit.
        let p = DevicePolicy::from_rules(&[
            c(1, Some(3), "rwm", true),
            rule(true, None, None, "m"),
            c(10, Some(200), "w", false),
            rule(false, Some(LinuxDeviceType::B), None, "m"),
            c(10, Some(200), "", true),
            c(10, Some(229), "rw", false),
        ])
        .unwrap();
        assert!(
            p.default_allow,
            "`a` allow: its access is ignored, as by the kernel"
        );
        assert_eq!(p.exceptions.len(), 2, "{p:?}");
        assert!(
            p.allows(DeviceKind::Char, 10, 200, RW),
            "its deny was taken back"
        );
        assert!(p.allows(DeviceKind::Char, 10, 229, ACCESS_MKNOD));
        assert!(!p.allows(DeviceKind::Char, 10, 229, ACCESS_READ | ACCESS_MKNOD));
        assert!(!p.allows(DeviceKind::Block, 8, 0, ACCESS_MKNOD));
        assert!(p.allows(DeviceKind::Block, 8, 0, RW));
        // No rules at all: nothing (the leading deny of every list).
        let none = DevicePolicy::from_rules(&[]).unwrap();
        assert!(!none.allows(DeviceKind::Char, 1, 3, ACCESS_READ));
    }

    #[test]
    fn refuses_what_the_devices_cgroup_refuses() {
        let e = |r: LinuxDeviceCgroup| DevicePolicy::from_rules(&[r]).unwrap_err().to_string();
        let u = rule(true, Some(LinuxDeviceType::U), Some((1, 3)), "r");
        assert!(e(u.clone()).contains("type must be a, b or c"), "{}", e(u));
        assert!(e(c(-1, Some(3), "r", true)).contains("between 0 and"));
        assert!(e(c(1 << 32, Some(3), "r", true)).contains("between 0 and"));
        assert!(e(c(1, Some(3), "x", true)).contains("r, w and m"));
        // v1 refuses the same up front.
        assert!(v1_writes(&[rule(true, Some(LinuxDeviceType::P), None, "r")]).is_err());
    }
}
