//! The auditor behind `sandboxd seccomp table|check|expect`: what a profile
//! does with every x86_64 syscall, and whether it is well formed.
//! (`diff` against another profile lives in [`super::diff`].)
//!
//! Everything here works on the profile's meaning, evaluated the way the
//! kernel runs the compiled stack (and libseccomp runs the same profile): an
//! unconditional rule decides alone; otherwise the highest-precedence action
//! among the matching conditional rules; otherwise the default action.

use std::collections::BTreeMap;

use super::compile::{clashes, compile, resolve, ResolvedRule};
use super::profile::{Action, Profile};
use super::{syscalls, SeccompError};

/// A profile resolved for evaluation: rules by syscall number.
#[derive(Debug, Clone)]
pub struct Evaluator {
    pub default: Action,
    pub rules: BTreeMap<u32, Vec<ResolvedRule>>,
}

impl Evaluator {
    /// Strict: the profile must compile-check (names, actions, args).
    pub fn new(profile: &Profile) -> Result<Evaluator, SeccompError> {
        Ok(Self::from_rules(
            profile.parsed_default()?,
            resolve(profile)?,
        ))
    }

    pub fn from_rules(default: Action, rules: Vec<ResolvedRule>) -> Evaluator {
        let mut by_nr: BTreeMap<u32, Vec<ResolvedRule>> = BTreeMap::new();
        for r in rules {
            by_nr.entry(r.nr).or_default().push(r);
        }
        Evaluator {
            default,
            rules: by_nr,
        }
    }

    /// The rules for syscall `nr` (empty when unlisted).
    pub fn rules_for(&self, nr: u32) -> &[ResolvedRule] {
        self.rules.get(&nr).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether any rule for `nr` looks at the arguments.
    pub fn is_conditional(&self, nr: u32) -> bool {
        let rs = self.rules_for(nr);
        !rs.is_empty() && rs.iter().all(|r| !r.conditions.is_empty())
    }

    /// What happens to syscall `nr` called with `args`.
    pub fn decide(&self, nr: u32, args: &[u64; 6]) -> Action {
        let rs = self.rules_for(nr);
        if let Some(u) = rs.iter().find(|r| r.conditions.is_empty()) {
            return u.action;
        }
        rs.iter()
            .filter(|r| r.matches(args))
            .map(|r| r.action)
            .max_by_key(|a| a.precedence())
            .unwrap_or(self.default)
    }
}

/// One line of `sandboxd seccomp table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRow {
    pub nr: u32,
    /// The syscall name, or `(unassigned)` for a number x86_64 does not use.
    pub name: &'static str,
    /// `allow`, `EPERM`, `ENOSYS (default)` or the conditional rules.
    pub action: String,
    /// The `comment` of the entries that decide it (group tag first).
    pub rationale: String,
    /// Whether the profile lists a non-allow rule for it (a deliberate denial,
    /// including an explicit entry equal to the default such as clone3).
    pub deliberate_denial: bool,
}

const UNLISTED: &str = "not listed: the default action, so libc falls back and syscalls \
                        added by newer kernels stay closed";

/// What the profile does with every number from 0 to [`syscalls::MAX_NR`].
pub fn table(profile: &Profile) -> Result<Vec<TableRow>, SeccompError> {
    let ev = Evaluator::new(profile)?;
    let mut rows = Vec::new();
    for nr in 0..=syscalls::MAX_NR {
        let Some(name) = syscalls::name(nr) else {
            rows.push(TableRow {
                nr,
                name: "(unassigned)",
                action: format!("{} (default)", ev.default.describe()),
                rationale: "no x86_64 syscall has this number".into(),
                deliberate_denial: false,
            });
            continue;
        };
        let rs = ev.rules_for(nr);
        let mut comments: Vec<&str> = Vec::new();
        for r in rs {
            let c = profile.syscalls[r.entry].comment.as_deref().unwrap_or("");
            if !comments.contains(&c) {
                comments.push(c);
            }
        }
        let action = if rs.is_empty() {
            format!("{} (default)", ev.default.describe())
        } else if !ev.is_conditional(nr) {
            ev.decide(nr, &[0; 6]).describe()
        } else {
            describe_conditional(&ev, rs)
        };
        rows.push(TableRow {
            nr,
            name,
            action,
            rationale: if rs.is_empty() {
                UNLISTED.into()
            } else {
                comments.join(" / ")
            },
            deliberate_denial: rs.iter().any(|r| !r.action.allows()),
        });
    }
    Ok(rows)
}

fn describe_conditional(ev: &Evaluator, rs: &[ResolvedRule]) -> String {
    let mut by_action: Vec<(Action, Vec<String>)> = Vec::new();
    for r in rs {
        let cond = r
            .conditions
            .iter()
            .map(|(c, _)| c.describe())
            .collect::<Vec<_>>()
            .join(" && ");
        match by_action.iter_mut().find(|(a, _)| *a == r.action) {
            Some((_, v)) => v.push(cond),
            None => by_action.push((r.action, vec![cond])),
        }
    }
    let mut parts: Vec<String> = by_action
        .into_iter()
        .map(|(a, conds)| {
            if conds.len() > 10 {
                format!("{} for {} argument patterns", a.describe(), conds.len())
            } else {
                format!("{} if {}", a.describe(), conds.join(" || "))
            }
        })
        .collect();
    parts.push(format!("else {}", ev.default.describe()));
    parts.join("; ")
}

/// The result of `sandboxd seccomp check`.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Anything wrong; `check` exits non-zero when this is not empty.
    pub problems: Vec<String>,
    /// Informational remarks.
    pub notes: Vec<String>,
    /// `(filter, BPF instructions)` in install order, when it compiles.
    pub filters: Vec<(String, usize)>,
}

/// Compiles the profile, counts instructions, and flags duplicates and
/// conditional/unconditional clashes (all of them, not just the first).
pub fn check(profile: &Profile) -> CheckReport {
    let mut rep = CheckReport::default();
    let default = match profile.parsed_default() {
        Ok(d) => d,
        Err(e) => {
            rep.problems.push(e.to_string());
            return rep;
        }
    };
    let rules = match resolve(profile) {
        Ok(r) => r,
        Err(e) => {
            rep.problems.push(e.to_string());
            return rep;
        }
    };
    for c in clashes(&rules) {
        rep.problems.push(format!(
            "clash: {} {} (syscalls[{}] and syscalls[{}])",
            c.name, c.reason, c.unconditional, c.other
        ));
    }
    // Duplicates: the same syscall with the same action and the same
    // conditions in two places (or twice in one entry).
    let mut seen: BTreeMap<(u32, Action, String), usize> = BTreeMap::new();
    for r in &rules {
        let conds: Vec<String> = r.conditions.iter().map(|(c, _)| c.describe()).collect();
        let key = (r.nr, r.action, conds.join(" && "));
        if let Some(first) = seen.insert(key, r.entry) {
            let at = if first == r.entry {
                format!("twice in syscalls[{first}]")
            } else {
                format!("in syscalls[{first}] and syscalls[{}]", r.entry)
            };
            rep.problems.push(format!(
                "duplicate: {} ({}) listed {at}",
                r.name,
                r.action.describe()
            ));
        }
    }
    for (i, e) in profile.syscalls.iter().enumerate() {
        if e.comment.as_deref().unwrap_or("").trim().is_empty() {
            rep.notes.push(format!(
                "syscalls[{i}] ({}): no comment (rationale)",
                e.names_list()
            ));
        }
        if let Ok(a) = Action::parse(&e.action, e.errno_ret) {
            if a == default {
                rep.notes.push(format!(
                    "syscalls[{i}] ({}): action equals the default ({}); documented, needs no BPF",
                    e.names_list(),
                    a.describe()
                ));
            }
        }
    }
    match compile(profile) {
        Ok(c) => {
            rep.filters = c
                .filters
                .iter()
                .map(|f| (f.name.clone(), f.program.len()))
                .collect()
        }
        Err(e) => rep.problems.push(e.to_string()),
    }
    rep
}

/// One syscall the probe must see fail with `errno`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    pub nr: u32,
    pub name: String,
    pub errno: u32,
}

/// Every call whose outcome does not depend on its arguments and is an
/// errno: listed denials, unlisted syscalls, unassigned numbers up to the
/// table's highest, and two numbers above it. Conditional syscalls are left
/// to the probe's argument checks ([`conditional_syscalls`]).
pub fn expectations(profile: &Profile) -> Result<Vec<Expectation>, SeccompError> {
    let ev = Evaluator::new(profile)?;
    let mut out = Vec::new();
    let extra = [syscalls::MAX_NR + 1, syscalls::MAX_NR + 100];
    for nr in (0..=syscalls::MAX_NR).chain(extra) {
        if ev.is_conditional(nr) {
            continue;
        }
        if let Action::Errno(errno) = ev.decide(nr, &[0; 6]) {
            let name = syscalls::name(nr)
                .map(str::to_string)
                .unwrap_or_else(|| format!("nr_{nr}"));
            out.push(Expectation { nr, name, errno });
        }
    }
    Ok(out)
}

/// Names of the syscalls whose rules depend on arguments.
pub fn conditional_syscalls(profile: &Profile) -> Result<Vec<&'static str>, SeccompError> {
    let ev = Evaluator::new(profile)?;
    Ok(ev
        .rules
        .keys()
        .filter(|nr| ev.is_conditional(**nr))
        .filter_map(|nr| syscalls::name(*nr))
        .collect())
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
