//! Compiles a [`Profile`] to stacked BPF programs with `seccompiler`, and
//! installs them.
//!
//! seccompiler gives every filter one match action and one mismatch action,
//! so a profile becomes a stack:
//! 1. the allow-list: every `SCMP_ACT_ALLOW` rule, mismatch = the profile's
//!    default action (ENOSYS for ours);
//! 2. one filter per other action (EPERM for ours): its rules, mismatch =
//!    allow.
//!
//! The kernel runs every filter and keeps the highest-precedence result; on a
//! tie (two ERRNOs) the most recently installed filter wins. So the deny
//! filters are installed after the allow-list: a deliberately denied syscall
//! gets EPERM (deny filter) rather than ENOSYS (allow-list default).
//!
//! Foreign ABIs are killed (SIGSYS, the whole process): i386 by the
//! architecture check seccompiler puts first in every filter, x32 by the
//! check [`abi::kill_x32`] adds to the first filter.
//!
//! Rules mean what libseccomp (runc) makes of the same profile: 64-bit
//! comparisons, an entry's `args` ANDed, entries ORed. Profiles that the two
//! would read differently are refused: an unconditional and a conditional
//! rule for one syscall (libseccomp keeps only the unconditional one,
//! seccompiler drops it inside a filter), two comparisons of one argument in
//! one entry (libseccomp rejects them), and `SCMP_CMP_MASKED_EQ` whose
//! expected value has bits outside the mask.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::profile::{Action, ArgCondition, CmpOp, Profile};
use super::{abi, syscalls, SeccompError};

/// The kernel's limit on one BPF program (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = 4096;

/// One compiled BPF program of the stack.
#[derive(Debug, Clone)]
pub struct CompiledFilter {
    /// `allow-list` or `deny (EPERM)`...
    pub name: String,
    pub match_action: Action,
    pub mismatch_action: Action,
    /// Number of syscalls with at least one rule in this filter.
    pub syscalls: usize,
    pub program: BpfProgram,
}

/// The stacked filters, in the order they must be installed.
#[derive(Debug, Clone)]
pub struct CompiledFilters {
    pub filters: Vec<CompiledFilter>,
}

impl CompiledFilters {
    /// BPF instruction count of each filter, in install order.
    pub fn instruction_counts(&self) -> Vec<usize> {
        self.filters.iter().map(|f| f.program.len()).collect()
    }
}

/// One rule of a profile resolved to a syscall number.
#[derive(Debug, Clone)]
pub struct ResolvedRule {
    /// Index of the `syscalls[]` entry it comes from.
    pub entry: usize,
    pub nr: u32,
    pub name: &'static str,
    pub action: Action,
    /// ANDed; empty means unconditional.
    pub conditions: Vec<(ArgCondition, CmpOp)>,
}

impl ResolvedRule {
    /// Whether this rule matches a call with these arguments.
    pub fn matches(&self, args: &[u64; 6]) -> bool {
        self.conditions
            .iter()
            .all(|(c, op)| c.matches(*op, args[c.index as usize]))
    }
}

/// Resolves every entry of `profile` strictly: unknown names, actions and
/// operators, out-of-range argument indices, Docker-only conditions and
/// forms libseccomp would read differently are errors naming the entry.
pub fn resolve(profile: &Profile) -> Result<Vec<ResolvedRule>, SeccompError> {
    let mut out = Vec::new();
    for (index, e) in profile.syscalls.iter().enumerate() {
        let fail = |reason: String| profile.entry_error(index, reason);
        if e.names.is_empty() {
            return Err(fail("no syscall names".into()));
        }
        if e.includes.is_some() || e.excludes.is_some() {
            return Err(fail(
                "includes/excludes are Docker-only conditions; a sandboxd profile must not use them"
                    .into(),
            ));
        }
        let action = Action::parse(&e.action, e.errno_ret).map_err(fail)?;
        let mut conditions = Vec::new();
        let mut seen_args = [false; 6];
        for c in e.conditions() {
            if c.index > 5 {
                return Err(fail(format!(
                    "argument index {} out of range (syscalls have arguments 0..=5)",
                    c.index
                )));
            }
            let op = CmpOp::parse(&c.op).map_err(fail)?;
            if std::mem::replace(&mut seen_args[c.index as usize], true) {
                return Err(fail(format!(
                    "two comparisons of argument {} in one entry (libseccomp rejects this; \
                     use separate entries)",
                    c.index
                )));
            }
            if op == CmpOp::MaskedEq && c.value_two & !c.value != 0 {
                return Err(fail(format!(
                    "SCMP_CMP_MASKED_EQ expects {:#x}, which has bits outside the mask {:#x}",
                    c.value_two, c.value
                )));
            }
            conditions.push((c.clone(), op));
        }
        for name in &e.names {
            let nr = syscalls::number(name).ok_or_else(|| {
                fail(format!(
                    "unknown syscall name {name:?} (not in the x86_64 table)"
                ))
            })?;
            let name = syscalls::name(nr).expect("number() returned a table entry");
            out.push(ResolvedRule {
                entry: index,
                nr,
                name,
                action,
                conditions: conditions.clone(),
            });
        }
    }
    Ok(out)
}

/// A syscall whose rules libseccomp and seccompiler would not both honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clash {
    pub name: &'static str,
    /// The entry with the unconditional rule.
    pub unconditional: usize,
    /// The entry with the other rule.
    pub other: usize,
    pub reason: String,
}

/// Every syscall with an unconditional rule plus a conditional one, or two
/// unconditional rules with different actions.
pub fn clashes(rules: &[ResolvedRule]) -> Vec<Clash> {
    let mut by_nr: BTreeMap<u32, Vec<&ResolvedRule>> = BTreeMap::new();
    for r in rules {
        by_nr.entry(r.nr).or_default().push(r);
    }
    let mut out = Vec::new();
    for rs in by_nr.values() {
        let Some(u) = rs.iter().find(|r| r.conditions.is_empty()) else {
            continue;
        };
        for o in rs.iter().filter(|o| o.entry != u.entry) {
            let reason = if !o.conditions.is_empty() {
                "has an unconditional rule and a conditional one: libseccomp keeps only the \
                 unconditional rule and seccompiler drops it within a filter"
            } else if o.action != u.action {
                "has unconditional rules with different actions"
            } else {
                continue;
            };
            out.push(Clash {
                name: u.name,
                unconditional: u.entry,
                other: o.entry,
                reason: reason.into(),
            });
        }
    }
    out
}

fn to_seccompiler(a: Action) -> SeccompAction {
    match a {
        Action::Allow => SeccompAction::Allow,
        Action::Log => SeccompAction::Log,
        Action::Errno(e) => SeccompAction::Errno(e),
        Action::Trap => SeccompAction::Trap,
        Action::KillThread => SeccompAction::KillThread,
        Action::KillProcess => SeccompAction::KillProcess,
    }
}

fn check_architectures(profile: &Profile) -> Result<(), SeccompError> {
    let ok = profile.architectures.is_empty()
        || profile
            .architectures
            .iter()
            .any(|a| a == "SCMP_ARCH_X86_64");
    if ok && profile.arch_map.is_empty() {
        return Ok(());
    }
    Err(SeccompError::Profile {
        file: profile.source.clone(),
        reason: "architectures must include SCMP_ARCH_X86_64 (and archMap is Docker-only); \
                 the compiled filter kills any other architecture"
            .into(),
    })
}

/// Compiles `profile` into the filters to install, in install order.
pub fn compile(profile: &Profile) -> Result<CompiledFilters, SeccompError> {
    let file = &profile.source;
    let default = profile.parsed_default()?;
    check_architectures(profile)?;
    let rules = resolve(profile)?;
    if let Some(c) = clashes(&rules).into_iter().next() {
        return Err(profile.entry_error(
            c.other,
            format!(
                "{} {} (see syscalls[{}])",
                c.name, c.reason, c.unconditional
            ),
        ));
    }

    // Group rules by action: allow-list first, then the others in order of
    // first appearance. Rules whose action is the default need no BPF.
    let mut groups: Vec<(Action, BTreeMap<i64, Vec<SeccompRule>>)> = Vec::new();
    if default != Action::Allow {
        groups.push((Action::Allow, BTreeMap::new()));
    }
    for r in rules.iter().filter(|r| r.action != default) {
        let pos = match groups.iter().position(|(a, _)| *a == r.action) {
            Some(p) => p,
            None => {
                groups.push((r.action, BTreeMap::new()));
                groups.len() - 1
            }
        };
        let chain = groups[pos].1.entry(i64::from(r.nr)).or_default();
        if r.conditions.is_empty() {
            continue; // An empty chain is seccompiler's "match any arguments".
        }
        let conds = r
            .conditions
            .iter()
            .map(|(c, op)| {
                let (op, value) = match op {
                    CmpOp::Ne => (SeccompCmpOp::Ne, c.value),
                    CmpOp::Lt => (SeccompCmpOp::Lt, c.value),
                    CmpOp::Le => (SeccompCmpOp::Le, c.value),
                    CmpOp::Eq => (SeccompCmpOp::Eq, c.value),
                    CmpOp::Ge => (SeccompCmpOp::Ge, c.value),
                    CmpOp::Gt => (SeccompCmpOp::Gt, c.value),
                    CmpOp::MaskedEq => (SeccompCmpOp::MaskedEq(c.value), c.value_two),
                };
                // Index validated by resolve(); the comparison is 64-bit, as
                // in libseccomp on x86_64.
                SeccompCondition::new(c.index as u8, SeccompCmpArgLen::Qword, op, value)
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(SeccompRule::new)
            .map_err(|source| SeccompError::Bpf {
                file: file.clone(),
                filter: format!("syscalls[{}]", r.entry),
                source,
            })?;
        chain.push(conds);
    }

    let mut filters = Vec::new();
    for (action, map) in groups {
        let (name, matched, mismatched) = if action == Action::Allow {
            (
                format!("allow-list (default {})", default.describe()),
                Action::Allow,
                default,
            )
        } else {
            (
                format!("deny ({})", action.describe()),
                action,
                Action::Allow,
            )
        };
        let syscalls = map.len();
        let filter = SeccompFilter::new(
            map,
            to_seccompiler(mismatched),
            to_seccompiler(matched),
            TargetArch::x86_64,
        )
        .map_err(|source| SeccompError::Bpf {
            file: file.clone(),
            filter: name.clone(),
            source,
        })?;
        let program = match BpfProgram::try_from(filter) {
            Ok(mut p) => {
                // The first filter of the stack also kills the x32 ABI
                // (the architecture check already kills i386).
                if filters.is_empty() && !abi::kill_x32(&mut p) {
                    return Err(SeccompError::NoArchCheck {
                        file: file.clone(),
                        filter: name,
                    });
                }
                if p.len() > MAX_INSTRUCTIONS {
                    return Err(too_large(file, &name, p.len()));
                }
                p
            }
            Err(seccompiler::BackendError::FilterTooLarge(n)) => {
                return Err(too_large(file, &name, n));
            }
            Err(source) => {
                return Err(SeccompError::Bpf {
                    file: file.clone(),
                    filter: name,
                    source,
                })
            }
        };
        filters.push(CompiledFilter {
            name,
            match_action: matched,
            mismatch_action: mismatched,
            syscalls,
            program,
        });
    }
    Ok(CompiledFilters { filters })
}

fn too_large(file: &str, filter: &str, instructions: usize) -> SeccompError {
    SeccompError::TooLarge {
        file: file.to_string(),
        filter: filter.to_string(),
        instructions,
    }
}

/// Installs the filters on the calling thread, in order. The caller must
/// already have set no_new_privs (seccompiler sets it again, harmlessly) and
/// must exec right after: nothing but the exec should run under the filter.
pub fn install(filters: &CompiledFilters) -> Result<(), SeccompError> {
    for f in &filters.filters {
        seccompiler::apply_filter(&f.program).map_err(|source| SeccompError::Install {
            filter: f.name.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;
