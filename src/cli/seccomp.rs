//! `sandboxd seccomp ...`: the auditor's and tests' view of the profile.
//!
//! - `table`: every x86_64 syscall number with its action and rationale;
//! - `diff [--against F]`: disagreements with a Docker-format profile
//!   (default: Docker's own, `seccomp/reference/docker-default.json`);
//! - `check`: compiles, counts BPF instructions, flags duplicates and clashes;
//! - `expect`: the calls the probe must see fail, one `nr name errno` a line;
//! - `run -- CMD...`: exec CMD under the compiled filters (evidence tool).
//!
//! Output goes to stdout; the exit code says whether the evidence holds.

use std::path::PathBuf;

use anyhow::Context;

use crate::seccomp::{self, audit, diff};

#[derive(Debug, clap::Subcommand)]
pub enum SeccompCmd {
    /// Print every x86_64 syscall number and name with its action and rationale.
    Table {
        /// Profile to read instead of the embedded default.
        #[arg(long)]
        profile: Option<PathBuf>,
        /// Only the syscalls the profile deliberately denies (EPERM etc.).
        #[arg(long)]
        denied: bool,
        /// Print a Markdown table.
        #[arg(long)]
        markdown: bool,
    },
    /// Compare with another profile in Docker format; non-zero exit if we
    /// allow anything it denies.
    Diff {
        /// The other profile; default: Docker's default profile, embedded
        /// from seccomp/reference/docker-default.json (origin and version in
        /// seccomp/reference/README.md).
        #[arg(long)]
        against: Option<PathBuf>,
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Compile, count instructions, flag duplicates and clashes; non-zero on
    /// any problem.
    Check {
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Print `nr name errno` for every call whose result does not depend on
    /// its arguments and is an errno (the probe's input).
    Expect {
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Set no_new_privs, install the filters and exec CMD.
    Run {
        #[arg(long)]
        profile: Option<PathBuf>,
        /// The command and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
}

/// Runs one subcommand; returns the process exit code.
pub fn run(cmd: SeccompCmd) -> anyhow::Result<i32> {
    match cmd {
        SeccompCmd::Table {
            profile,
            denied,
            markdown,
        } => {
            let (p, _) = seccomp::load_profile(profile.as_deref())?;
            let rows = audit::table(&p)?;
            if markdown {
                println!("| nr | syscall | action | rationale |\n|---:|---|---|---|");
            }
            for r in rows.iter().filter(|r| !denied || r.deliberate_denial) {
                if markdown {
                    let esc = |s: &str| s.replace('|', "\\|");
                    let (a, why) = (esc(&r.action), esc(&r.rationale));
                    println!("| {} | `{}` | {a} | {why} |", r.nr, r.name);
                } else {
                    println!(
                        "{:>3}  {:<24} {:<18} {}",
                        r.nr, r.name, r.action, r.rationale
                    );
                }
            }
            Ok(0)
        }
        SeccompCmd::Diff { against, profile } => {
            let (ours, _) = seccomp::load_profile(profile.as_deref())?;
            let theirs = match &against {
                Some(path) => seccomp::load_profile(Some(path))?.0,
                None => seccomp::docker_reference()?,
            };
            let d = diff::diff(&ours, &theirs)?;
            println!(
                "# ours: {}\n# theirs: {} (as applied to a container with no capabilities, x86_64)",
                ours.source, theirs.source
            );
            for (title, lines) in [
                ("we deny, they allow", &d.we_deny_they_allow),
                ("we allow, they deny", &d.we_allow_they_deny),
            ] {
                println!("\n{title}: {}", lines.len());
                if lines.is_empty() {
                    println!("  (none)");
                }
                for l in lines.iter() {
                    let when = l
                        .witness
                        .as_deref()
                        .map(|w| format!(" when {w}"))
                        .unwrap_or_default();
                    println!(
                        "  {:>3} {:<22} ours {} / theirs {}{when}",
                        l.nr, l.name, l.ours, l.theirs
                    );
                }
            }
            Ok(if d.we_allow_they_deny.is_empty() {
                0
            } else {
                1
            })
        }
        SeccompCmd::Check { profile } => {
            let (p, _) = seccomp::load_profile(profile.as_deref())?;
            let rep = audit::check(&p);
            println!("# profile: {}", p.source);
            for (name, n) in &rep.filters {
                println!("filter {name}: {n} BPF instructions (limit 4096)");
            }
            for n in &rep.notes {
                println!("note: {n}");
            }
            for pr in &rep.problems {
                println!("problem: {pr}");
            }
            println!("{} problem(s)", rep.problems.len());
            Ok(if rep.problems.is_empty() { 0 } else { 1 })
        }
        SeccompCmd::Expect { profile } => {
            let (p, _) = seccomp::load_profile(profile.as_deref())?;
            for e in audit::expectations(&p)? {
                println!("{} {} {}", e.nr, e.name, e.errno);
            }
            Ok(0)
        }
        SeccompCmd::Run { profile, cmd } => exec_under_filter(profile, cmd),
    }
}

/// Compile first (fail before touching the process), then no_new_privs,
/// filters, exec. Nothing but the exec runs under the filter.
fn exec_under_filter(profile: Option<PathBuf>, cmd: Vec<String>) -> anyhow::Result<i32> {
    use std::ffi::CString;
    let (_, _, filters) = seccomp::load_and_compile(profile.as_deref())?;
    let argv = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .context("command argument contains a NUL byte")?;
    nix::sys::prctl::set_no_new_privs().context("prctl(PR_SET_NO_NEW_PRIVS)")?;
    seccomp::install(&filters)?;
    let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
    Err(anyhow::anyhow!(
        "exec {:?} under the seccomp filter: {err}",
        cmd[0]
    ))
}
