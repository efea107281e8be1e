//! `sandboxd seccomp diff --against F`: compares our profile with another
//! one in the Docker/OCI format, syscall by syscall, for x86_64.
//!
//! The other profile is read the way Docker applies it to a container with
//! **no capabilities** (ours have none): entries that `includes` a
//! capability are skipped, entries that `excludes` one are kept, entries for
//! other architectures are skipped, `minKernel` is taken as satisfied, and
//! names that are not x86_64 syscalls are ignored.
//!
//! Conditional rules are compared at sample arguments built from every
//! comparison in either profile (each value, its neighbours, each mask bit
//! flipped, high bits set), so a difference shows with a witness argument.

use std::collections::BTreeSet;

use super::audit::Evaluator;
use super::compile::ResolvedRule;
use super::profile::{Action, ArgCondition, CmpOp, Profile};
use super::{syscalls, SeccompError};

/// One syscall on which the two profiles disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffLine {
    pub nr: u32,
    pub name: &'static str,
    /// Our action at the witness arguments.
    pub ours: String,
    /// Their action at the witness arguments.
    pub theirs: String,
    /// `None` when they differ whatever the arguments, else e.g. `arg1=0x5412`.
    pub witness: Option<String>,
}

/// Both directions of disagreement. "Deny" is any action that does not run
/// the syscall (ERRNO, TRAP, KILL); ALLOW and LOG run it.
#[derive(Debug, Clone, Default)]
pub struct Diff {
    pub we_deny_they_allow: Vec<DiffLine>,
    pub we_allow_they_deny: Vec<DiffLine>,
}

/// Resolves a Docker-format profile for a capability-less x86_64 container.
pub fn docker_evaluator(profile: &Profile) -> Result<Evaluator, SeccompError> {
    let default = profile.parsed_default()?;
    let x86 = |arches: &[String]| arches.iter().any(|a| a == "amd64" || a == "x86_64");
    let mut rules = Vec::new();
    for (index, e) in profile.syscalls.iter().enumerate() {
        let fail = |reason: String| profile.entry_error(index, reason);
        if let Some(inc) = &e.includes {
            if !inc.caps.is_empty() || (!inc.arches.is_empty() && !x86(&inc.arches)) {
                continue;
            }
        }
        if let Some(exc) = &e.excludes {
            if x86(&exc.arches) {
                continue;
            }
        }
        let action = Action::parse(&e.action, e.errno_ret).map_err(fail)?;
        let mut conditions = Vec::new();
        for c in e.conditions() {
            if c.index > 5 {
                return Err(fail(format!("argument index {} out of range", c.index)));
            }
            conditions.push((c.clone(), CmpOp::parse(&c.op).map_err(fail)?));
        }
        for name in &e.names {
            if let Some(nr) = syscalls::number(name) {
                rules.push(ResolvedRule {
                    entry: index,
                    nr,
                    name: syscalls::name(nr).expect("table entry"),
                    action,
                    conditions: conditions.clone(),
                });
            }
        }
    }
    Ok(Evaluator::from_rules(default, rules))
}

/// Sample values for one comparison.
fn samples(c: &ArgCondition, op: CmpOp, out: &mut BTreeSet<(u32, u64)>) {
    let i = c.index;
    let mut add = |v: u64| {
        out.insert((i, v));
    };
    for v in [c.value, c.value_two] {
        add(v);
        add(v.wrapping_sub(1));
        add(v.wrapping_add(1));
    }
    if op == CmpOp::MaskedEq {
        add(c.value_two | !c.value); // every bit outside the mask set
        add(c.value);
        for bit in 0..64 {
            if c.value & (1 << bit) != 0 {
                add(c.value_two ^ (1 << bit));
                add(1 << bit);
            }
        }
    }
}

/// Compares `ours` with `theirs` (Docker semantics, see the module docs).
pub fn diff(ours: &Profile, theirs: &Profile) -> Result<Diff, SeccompError> {
    let us = Evaluator::new(ours)?;
    let them = docker_evaluator(theirs)?;
    let mut d = Diff::default();
    for &(nr, name) in syscalls::SYSCALLS {
        let mut vals = BTreeSet::new();
        for r in us.rules_for(nr).iter().chain(them.rules_for(nr)) {
            for (c, op) in &r.conditions {
                samples(c, *op, &mut vals);
            }
        }
        for v in [0, 1, u64::from(u32::MAX), u64::MAX] {
            for i in 0..6 {
                if vals.iter().any(|(j, _)| *j == i) {
                    vals.insert((i, v));
                }
            }
        }
        let mut vectors: Vec<(Option<String>, [u64; 6])> = vec![(None, [0; 6])];
        for (i, v) in vals {
            let mut a = [0u64; 6];
            a[i as usize] = v;
            vectors.push((Some(format!("arg{i}={v:#x}")), a));
        }
        let conditional = vectors.len() > 1;
        let mut deny_allow: Option<DiffLine> = None;
        let mut allow_deny: Option<DiffLine> = None;
        let mut always = (true, true);
        for (witness, args) in &vectors {
            let (o, t) = (us.decide(nr, args), them.decide(nr, args));
            let line = || DiffLine {
                nr,
                name,
                ours: o.describe(),
                theirs: t.describe(),
                witness: witness
                    .clone()
                    .or_else(|| conditional.then(|| "all args 0".into())),
            };
            always.0 &= !o.allows() && t.allows();
            always.1 &= o.allows() && !t.allows();
            if !o.allows() && t.allows() && deny_allow.is_none() {
                deny_allow = Some(line());
            }
            if o.allows() && !t.allows() && allow_deny.is_none() {
                allow_deny = Some(line());
            }
        }
        for (slot, all, list) in [
            (deny_allow, always.0, &mut d.we_deny_they_allow),
            (allow_deny, always.1, &mut d.we_allow_they_deny),
        ] {
            if let Some(mut l) = slot {
                if all {
                    l.witness = None;
                }
                list.push(l);
            }
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{docker_reference, DEFAULT_PROFILE};

    fn docker() -> Profile {
        docker_reference().unwrap()
    }

    #[test]
    fn against_docker_we_never_allow_what_docker_denies() {
        let theirs = docker();
        let ours = Profile::parse(DEFAULT_PROFILE, "default").unwrap();
        let d = diff(&ours, &theirs).unwrap();
        assert!(
            d.we_allow_they_deny.is_empty(),
            "we allow, they deny: {:?}",
            d.we_allow_they_deny
        );
        let names: Vec<_> = d.we_deny_they_allow.iter().map(|l| l.name).collect();
        for n in [
            "ptrace",
            "process_vm_readv",
            "modify_ldt",
            "ioctl",
            "socket",
            "socketpair",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let ioctl = d
            .we_deny_they_allow
            .iter()
            .find(|l| l.name == "ioctl")
            .unwrap();
        assert!(
            ioctl.witness.is_some(),
            "ioctl differs only for some requests"
        );
    }

    #[test]
    fn a_looser_profile_shows_in_we_allow_they_deny() {
        let theirs = docker();
        let mut ours = Profile::parse(DEFAULT_PROFILE, "loose").unwrap();
        for e in &mut ours.syscalls {
            if e.names.iter().any(|n| n == "unshare") {
                e.action = "SCMP_ACT_ALLOW".into();
                e.errno_ret = None;
            }
        }
        let d = diff(&ours, &theirs).unwrap();
        let names: Vec<_> = d.we_allow_they_deny.iter().map(|l| l.name).collect();
        assert_eq!(names, ["unshare", "setns"]);
        assert!(d.we_allow_they_deny[0].witness.is_none());
    }
}
