//! Unit tests of the auditor: table coverage, check findings, expectations.

use super::*;
use crate::DEFAULT_PROFILE;

fn default_profile() -> Profile {
    Profile::parse(DEFAULT_PROFILE, "default").unwrap()
}

#[test]
fn table_covers_every_number_up_to_max() {
    let rows = table(&default_profile()).unwrap();
    let nrs: Vec<u32> = rows.iter().map(|r| r.nr).collect();
    assert_eq!(nrs, (0..=syscalls::MAX_NR).collect::<Vec<_>>());
    let get = |n: &str| rows.iter().find(|r| r.name == n).unwrap();
    assert_eq!(get("read").action, "allow");
    assert!(get("read").rationale.starts_with("[files]"));
    assert_eq!(get("ptrace").action, "EPERM");
    assert!(get("ptrace").deliberate_denial);
    assert!(get("ptrace").rationale.contains("[debugging]"));
    assert_eq!(get("clone3").action, "ENOSYS");
    assert_eq!(get("uprobe").action, "ENOSYS (default)");
    let clone = &get("clone").action;
    assert!(
        clone.starts_with("allow if arg0 & 0x7e020000 == 0x0; EPERM if "),
        "{clone}"
    );
    assert!(clone.contains("arg0 & 0x10000000 == 0x10000000"), "{clone}");
    assert!(get("ioctl").action.contains("arg1 & 0xffffffff == 0x5412"));
    assert_eq!(rows[400].name, "(unassigned)");
}

#[test]
fn every_entry_of_the_default_profile_has_a_group_rationale() {
    for (i, e) in default_profile().syscalls.iter().enumerate() {
        let c = e.comment.as_deref().unwrap_or("");
        assert!(c.starts_with('['), "syscalls[{i}] has no [group] rationale");
    }
}

#[test]
fn check_passes_on_default_profile() {
    let rep = check(&default_profile());
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.filters.len(), 2);
}

#[test]
fn check_flags_a_planted_duplicate() {
    let mut p = default_profile();
    p.syscalls[0].names.push("read".into()); // read is already in [files]
    let rep = check(&p);
    assert!(
        rep.problems.iter().any(|m| m.contains("duplicate: read")),
        "{:?}",
        rep.problems
    );
}

#[test]
fn check_flags_a_planted_clash() {
    let mut p = default_profile();
    // An unconditional allow of socket beside the conditional socket rules.
    p.syscalls[0].names.push("socket".into());
    let rep = check(&p);
    assert!(
        rep.problems
            .iter()
            .any(|m| m.contains("clash: socket") && m.contains("unconditional")),
        "{:?}",
        rep.problems
    );
}

#[test]
fn expectations_cover_denials_unlisted_and_out_of_table() {
    let exp = expectations(&default_profile()).unwrap();
    let get = |n: &str| exp.iter().find(|e| e.name == n).map(|e| e.errno);
    let (eperm, enosys) = (Some(libc::EPERM as u32), Some(libc::ENOSYS as u32));
    assert_eq!(get("ptrace"), eperm);
    assert_eq!(get("mount"), eperm);
    assert_eq!(get("io_uring_setup"), eperm);
    assert_eq!(get("clone3"), enosys);
    assert_eq!(get("uprobe"), enosys);
    assert_eq!(get("nr_400"), enosys);
    assert_eq!(get(&format!("nr_{}", syscalls::MAX_NR + 1)), enosys);
    assert_eq!(get("read"), None);
    assert_eq!(
        get("clone"),
        None,
        "conditional: left to the probe's arg checks"
    );
    let cond = conditional_syscalls(&default_profile()).unwrap();
    assert_eq!(cond, ["ioctl", "socket", "clone", "personality"]);
}
