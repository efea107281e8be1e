//! The device allow-list of a sandbox's cgroup: OCI
//! `linux.resources.devices`, enforced by the v1 `devices` controller.
//!
//! The rules are applied in their listed order (as the OCI spec requires)
//! on top of an empty list: the cgroup first gets `a` in `devices.deny`
//! (deny everything, drop every exception), so a sandbox can use exactly the
//! devices its rules allow, whatever the parent allows. Access and
//! creation (`mknod`) are both covered (`r`, `w`, `m`), for every process in
//! the cgroup, root with every capability included.
//!
//! cgroup v2 has no devices files: there the kernel checks a BPF program
//! attached to the cgroup (`BPF_CGROUP_DEVICE`), which this crate does not
//! build; on a pure v2 host the rules are not enforced
//! ([`CgroupRoot::enforces_devices`](super::CgroupRoot::enforces_devices)).

use std::path::Path;

use oci_spec::runtime::LinuxDeviceCgroup;

use super::{files, CgroupError};

/// One write to a v1 devices file: `(file name, line)`.
pub type DeviceWrite = (&'static str, String);

/// The writes that turn a fresh v1 devices cgroup into exactly `rules`:
/// `a` to `devices.deny` first, then each rule in order. An empty access
/// means `rwm` (all of them), as in runc.
pub fn v1_writes(rules: &[LinuxDeviceCgroup]) -> Result<Vec<DeviceWrite>, CgroupError> {
    let mut out = vec![("devices.deny", "a".to_string())];
    for r in rules {
        let access = r.access().as_deref().unwrap_or("");
        let access = if access.is_empty() { "rwm" } else { access };
        if !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(CgroupError::BadDeviceRule {
                rule: r.to_string(),
                reason: "access must be made of r, w and m",
            });
        }
        let num = |n: Option<i64>| n.map_or_else(|| "*".to_string(), |n| n.to_string());
        if r.major().is_some_and(|n| n < 0) || r.minor().is_some_and(|n| n < 0) {
            return Err(CgroupError::BadDeviceRule {
                rule: r.to_string(),
                reason: "major and minor must not be negative",
            });
        }
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
}
