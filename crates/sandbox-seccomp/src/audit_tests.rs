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
    assert!(get("ioctl").action.contains("arg1 & 0xffffffff == 0x5423"));
    let socket = &get("socket").action;
    assert!(socket.starts_with("allow if arg0 == 0x1 || "), "{socket}");
    assert!(
        socket.contains("EAFNOSUPPORT if arg0 == 0x0 || "),
        "{socket}"
    );
    assert!(
        socket.contains("EPROTONOSUPPORT for 20 argument patterns"),
        "{socket}"
    );
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
    assert_eq!(rep.filters.len(), 4);
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
    assert_eq!(
        cond,
        ["ioctl", "socket", "socketpair", "clone", "personality"]
    );
}

/// What the default profile decides for socket()/socketpair()/ioctl() over
/// every family, protocol and request near the rules (and with high garbage
/// bits), and that no allow rule overlaps a deny rule there: the policy of
/// docs/seccomp.md, evaluated as the kernel runs the compiled stack.
#[test]
fn socket_and_ioctl_rules_mean_the_documented_policy() {
    let ev = Evaluator::new(&default_profile()).unwrap();
    let nr = |n: &str| syscalls::number(n).unwrap();
    let (allow, enosys) = (Action::Allow, Action::Errno(libc::ENOSYS as u32));
    let eafnosupport = Action::Errno(libc::EAFNOSUPPORT as u32);
    let eprotonosupport = Action::Errno(libc::EPROTONOSUPPORT as u32);
    let eperm = Action::Errno(libc::EPERM as u32);
    let high = [1u64 << 32, u64::MAX << 32, 0xffff_ffff, u64::MAX];
    let values = |top: u64| {
        let mut v: Vec<u64> = (0..=top).collect();
        for h in high {
            v.extend((0..64).map(|x| h | x));
        }
        v
    };
    let overlap = |nr: u32, args: &[u64; 6]| {
        let actions: std::collections::BTreeSet<Action> = ev
            .rules_for(nr)
            .iter()
            .filter(|r| r.matches(args))
            .map(|r| r.action)
            .collect();
        assert!(actions.len() <= 1, "nr {nr} {args:x?}: {actions:?}");
    };
    let protocols: [(u64, &[u64]); 4] = [
        (1, &[]), // AF_UNIX: any protocol
        (2, &[0, 1, 6, 17]),
        (10, &[0, 6, 17, 58]),
        (16, &[0]),
    ];
    for family in values(300) {
        for proto in values(600) {
            let args = [family, 1, proto, 0, 0, 0];
            overlap(nr("socket"), &args);
            let want = match protocols.iter().find(|(f, _)| *f == family) {
                None => eafnosupport,
                Some((1, _)) => allow,
                Some((_, ok)) if ok.contains(&proto) => allow,
                Some(_) => eprotonosupport,
            };
            assert_eq!(ev.decide(nr("socket"), &args), want, "socket {args:x?}");
        }
        let args = [family, 1, 0, 0, 0, 0];
        overlap(nr("socketpair"), &args);
        let want = if family == 1 { allow } else { eafnosupport };
        assert_eq!(ev.decide(nr("socketpair"), &args), want, "{args:x?}");
    }
    let denied = [0x5412u64, 0x541c, 0x5423];
    let mut requests = values(0x1_0000);
    for d in denied {
        requests.extend((0..64).map(|b| d ^ (1 << b)));
    }
    for req in requests {
        let args = [0, req, 0, 0, 0, 0];
        overlap(nr("ioctl"), &args);
        let want = if denied.contains(&(req & 0xffff_ffff)) {
            eperm
        } else {
            allow
        };
        assert_eq!(ev.decide(nr("ioctl"), &args), want, "ioctl {req:#x}");
    }
    // Nothing of these three falls to the default.
    assert_ne!(ev.decide(nr("socket"), &[99, 0, 0, 0, 0, 0]), enosys);
}
