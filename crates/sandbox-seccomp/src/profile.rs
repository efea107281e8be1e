//! Serde types for the OCI seccomp format, which is also the format of
//! Docker's default profile (`defaultAction`, `defaultErrnoRet`,
//! `architectures`, `syscalls[]` with `names`, `action`, `errnoRet`, `args`).
//!
//! Extensions, ignored by OCI consumers such as runc: a `comment` on the
//! profile and on each `syscalls[]` entry (our rationale), and Docker's
//! `archMap`, `includes` and `excludes` (read so that Docker's own profile can
//! be diffed; rejected by [`compile`](super::compile())).
//!
//! Unknown fields are rejected: a misspelt `errnoRet` must not silently turn a
//! denial into the default action.

use serde::{Deserialize, Serialize};

use super::SeccompError;

/// A whole seccomp profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Where the profile came from (a path or the embedded default); not JSON.
    #[serde(skip)]
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    pub default_action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_errno_ret: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    /// Docker only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arch_map: Vec<ArchMap>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    #[serde(default)]
    pub syscalls: Vec<SyscallEntry>,
}

/// Docker's `archMap` item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArchMap {
    pub architecture: String,
    #[serde(default)]
    pub sub_architectures: Option<Vec<String>>,
}

/// One `syscalls[]` entry: the action for a set of names, optionally only
/// when all of `args` match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SyscallEntry {
    pub names: Vec<String>,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno_ret: Option<u32>,
    /// Docker writes `"args": null`; both that and a missing field mean none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<ArgCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Docker only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub includes: Option<DockerFilter>,
    /// Docker only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excludes: Option<DockerFilter>,
}

/// One argument comparison (`SCMP_CMP_*`). For `SCMP_CMP_MASKED_EQ`, `value`
/// is the mask and `valueTwo` the expected masked value, as in libseccomp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArgCondition {
    pub index: u32,
    pub value: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub value_two: u64,
    pub op: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Docker's `includes`/`excludes` conditions on an entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DockerFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caps: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arches: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_kernel: Option<String>,
}

/// A seccomp action, parsed from `SCMP_ACT_*` plus its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Allow,
    Log,
    Errno(u32),
    Trap,
    KillThread,
    KillProcess,
}

impl Action {
    /// Parses `action`; `errno` is the entry's `errnoRet` (or the profile's
    /// `defaultErrnoRet`). Like runc, `SCMP_ACT_ERRNO` without one is EPERM.
    pub fn parse(action: &str, errno: Option<u32>) -> Result<Action, String> {
        Ok(match action {
            "SCMP_ACT_ALLOW" => Action::Allow,
            "SCMP_ACT_LOG" => Action::Log,
            "SCMP_ACT_ERRNO" => Action::Errno(errno.unwrap_or(libc::EPERM as u32)),
            "SCMP_ACT_TRAP" => Action::Trap,
            "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => Action::KillThread,
            "SCMP_ACT_KILL_PROCESS" => Action::KillProcess,
            other => {
                return Err(format!(
                    "unknown or unsupported action {other:?} (supported: SCMP_ACT_ALLOW, \
                     SCMP_ACT_LOG, SCMP_ACT_ERRNO, SCMP_ACT_TRAP, SCMP_ACT_KILL, \
                     SCMP_ACT_KILL_THREAD, SCMP_ACT_KILL_PROCESS)"
                ))
            }
        })
    }

    /// Whether the syscall runs (ALLOW and LOG do).
    pub fn allows(self) -> bool {
        matches!(self, Action::Allow | Action::Log)
    }

    /// Kernel precedence: when several filters or rules apply, the highest wins.
    pub fn precedence(self) -> u8 {
        match self {
            Action::Allow => 0,
            Action::Log => 1,
            Action::Errno(_) => 2,
            Action::Trap => 3,
            Action::KillThread => 4,
            Action::KillProcess => 5,
        }
    }

    /// Short human form: `allow`, `EPERM`, `ENOSYS`, `errno 5`, `kill-process`...
    pub fn describe(self) -> String {
        match self {
            Action::Allow => "allow".into(),
            Action::Log => "log+allow".into(),
            Action::Errno(e) => errno_name(e),
            Action::Trap => "trap (SIGSYS)".into(),
            Action::KillThread => "kill-thread".into(),
            Action::KillProcess => "kill-process".into(),
        }
    }
}

/// `EPERM`, `ENOSYS`... for the errnos a profile uses, else `errno N`.
pub fn errno_name(e: u32) -> String {
    match e as i32 {
        libc::EPERM => "EPERM".into(),
        libc::ENOSYS => "ENOSYS".into(),
        libc::EACCES => "EACCES".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EAFNOSUPPORT => "EAFNOSUPPORT".into(),
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT".into(),
        _ => format!("errno {e}"),
    }
}

/// A comparison operator (`SCMP_CMP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Ne,
    Lt,
    Le,
    Eq,
    Ge,
    Gt,
    MaskedEq,
}

impl CmpOp {
    pub fn parse(op: &str) -> Result<CmpOp, String> {
        Ok(match op {
            "SCMP_CMP_NE" => CmpOp::Ne,
            "SCMP_CMP_LT" => CmpOp::Lt,
            "SCMP_CMP_LE" => CmpOp::Le,
            "SCMP_CMP_EQ" => CmpOp::Eq,
            "SCMP_CMP_GE" => CmpOp::Ge,
            "SCMP_CMP_GT" => CmpOp::Gt,
            "SCMP_CMP_MASKED_EQ" => CmpOp::MaskedEq,
            other => return Err(format!("unknown comparison operator {other:?}")),
        })
    }
}

impl ArgCondition {
    /// Whether a 64-bit argument value satisfies this comparison (libseccomp
    /// semantics on a 64-bit architecture: full 64-bit, unsigned).
    pub fn matches(&self, op: CmpOp, arg: u64) -> bool {
        match op {
            CmpOp::Ne => arg != self.value,
            CmpOp::Lt => arg < self.value,
            CmpOp::Le => arg <= self.value,
            CmpOp::Eq => arg == self.value,
            CmpOp::Ge => arg >= self.value,
            CmpOp::Gt => arg > self.value,
            CmpOp::MaskedEq => arg & self.value == self.value_two,
        }
    }

    /// `arg1 & 0xffffffff == 0x5412`, `arg0 < 38`...
    pub fn describe(&self) -> String {
        let op = CmpOp::parse(&self.op);
        let i = self.index;
        match op {
            Ok(CmpOp::MaskedEq) => format!("arg{i} & {:#x} == {:#x}", self.value, self.value_two),
            Ok(o) => {
                let s = match o {
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Eq => "==",
                    CmpOp::Ge => ">=",
                    _ => ">",
                };
                format!("arg{i} {s} {:#x}", self.value)
            }
            Err(_) => format!("arg{i} {} {:#x}", self.op, self.value),
        }
    }
}

impl SyscallEntry {
    /// The argument conditions (none for an unconditional entry).
    pub fn conditions(&self) -> &[ArgCondition] {
        self.args.as_deref().unwrap_or(&[])
    }

    /// The names, comma-separated, for error messages and reports.
    pub fn names_list(&self) -> String {
        self.names.join(",")
    }
}

impl Profile {
    /// The error for `syscalls[index]`: names the file, the entry and why.
    pub fn entry_error(&self, index: usize, reason: String) -> SeccompError {
        SeccompError::Entry {
            file: self.source.clone(),
            index,
            names: self.syscalls[index].names_list(),
            reason,
        }
    }

    /// Parses profile JSON; `file` names it in errors.
    pub fn parse(raw: &str, file: &str) -> Result<Profile, SeccompError> {
        let mut profile: Profile =
            serde_json::from_str(raw).map_err(|source| SeccompError::Parse {
                file: file.to_string(),
                source,
            })?;
        profile.source = file.to_string();
        Ok(profile)
    }

    /// The default action (`defaultAction` with `defaultErrnoRet`).
    pub fn parsed_default(&self) -> Result<Action, SeccompError> {
        Action::parse(&self.default_action, self.default_errno_ret).map_err(|reason| {
            SeccompError::Profile {
                file: self.source.clone(),
                reason: format!("defaultAction: {reason}"),
            }
        })
    }

    /// The profile as JSON, comments included: what `config.json` gets under
    /// `linux.seccomp` when written verbatim (runc ignores `comment`).
    pub fn to_oci_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a profile always serializes")
    }

    /// The same profile as the `oci-spec` type the bundle builder uses. The
    /// rules are identical; the `comment` fields have no place in that type.
    pub fn to_oci(&self) -> Result<oci_spec::runtime::LinuxSeccomp, SeccompError> {
        let mut v = self.to_oci_value();
        strip_comments(&mut v);
        serde_json::from_value(v).map_err(|source| SeccompError::Oci {
            file: self.source.clone(),
            source,
        })
    }
}

fn strip_comments(v: &mut serde_json::Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.remove("comment");
        if let Some(serde_json::Value::Array(entries)) = obj.get_mut("syscalls") {
            for e in entries {
                if let Some(o) = e.as_object_mut() {
                    o.remove("comment");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_PROFILE;

    #[test]
    fn oci_form_keeps_every_rule() {
        let p = Profile::parse(DEFAULT_PROFILE, "default").unwrap();
        let oci = p.to_oci().unwrap();
        // Back through JSON into our type: only the comments differ.
        let back: Profile = serde_json::from_value(serde_json::to_value(&oci).unwrap()).unwrap();
        assert_eq!(back.syscalls.len(), p.syscalls.len());
        for (a, b) in back.syscalls.iter().zip(&p.syscalls) {
            assert_eq!(a.names, b.names);
            assert_eq!(a.action, b.action);
            assert_eq!(a.errno_ret, b.errno_ret);
            assert_eq!(a.conditions(), b.conditions());
            assert!(b.comment.is_some(), "every entry has a rationale");
        }
        assert_eq!(back.default_errno_ret, Some(38));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let raw = r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read"],"action":"SCMP_ACT_ERRNO","errnoret":1}]}"#;
        let err = Profile::parse(raw, "typo.json").unwrap_err().to_string();
        assert!(
            err.contains("typo.json") && err.contains("errnoret"),
            "{err}"
        );
    }
}
