//! The seccomp subsystem: the profile every native sandbox runs under, its
//! compiler to BPF and the auditor behind `sandboxd seccomp ...`.
//!
//! One profile, in the OCI/Docker seccomp format ([`DEFAULT_PROFILE`], the
//! file `seccomp/default.json`), is the single source:
//! - the bundle builder writes it into `config.json` (`linux.seccomp`) with
//!   [`Profile::to_oci`] (or [`Profile::to_oci_value`] to keep comments);
//! - the native launcher runs it as stacked BPF filters built by [`compile`]
//!   and installed by [`install`] as the very last step before exec (the
//!   daemon's launches read the stack it compiled at start, in the
//!   [`wire`] format, instead of compiling it again);
//! - the daemon calls [`load_and_compile`] at start-up and refuses to start on
//!   any error (there is no "no filter" fallback).
//!
//! Layout: [`profile`] (serde types), [`syscalls`] (x86_64 name/number
//! table), [`compile`](mod@compile) (BPF generation and installation),
//! [`audit`] (table, diff against another profile, check).
//!
//! This module owns no process state: it never forks, never sets
//! no_new_privs on its own (seccompiler's `apply_filter` does, and the
//! launcher does so explicitly right before), and touches no files other than
//! the profile it is asked to read.

pub mod abi;
pub mod audit;
pub mod compile;
pub mod diff;
pub mod profile;
pub mod syscalls;
pub mod wire;

use std::path::{Path, PathBuf};

pub use compile::{compile, install, CompiledFilter, CompiledFilters};
pub use profile::Profile;

/// The default profile, embedded so the daemon runs with no installed files.
pub const DEFAULT_PROFILE: &str = include_str!("../../../seccomp/default.json");

/// Docker's default profile, the reference `sandboxd seccomp diff` compares
/// with (see `seccomp/reference/README.md` for its origin and version).
pub const DOCKER_REFERENCE: &str = include_str!("../../../seccomp/reference/docker-default.json");

/// What reports name the embedded Docker reference.
pub const DOCKER_REFERENCE_NAME: &str = "<embedded seccomp/reference/docker-default.json>";

/// The parsed Docker reference profile.
pub fn docker_reference() -> Result<Profile, SeccompError> {
    Profile::parse(DOCKER_REFERENCE, DOCKER_REFERENCE_NAME)
}

/// What [`load_profile`] names the embedded profile in errors and reports.
pub const DEFAULT_PROFILE_NAME: &str = "<embedded seccomp/default.json>";

/// Every way loading, compiling or installing a profile can fail. Each error
/// names the profile file and, where one is to blame, the `syscalls[]` entry.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("{}: cannot read seccomp profile: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: malformed seccomp profile: {source}")]
    Parse {
        file: String,
        source: serde_json::Error,
    },
    #[error("{file}: {reason}")]
    Profile { file: String, reason: String },
    #[error("{file}: syscalls[{index}] ({names}): {reason}")]
    Entry {
        file: String,
        index: usize,
        names: String,
        reason: String,
    },
    #[error(
        "{file}: the {filter} filter compiles to {instructions} BPF instructions; \
         the kernel accepts at most 4096 (seccompiler: fewer than 4096)"
    )]
    TooLarge {
        file: String,
        filter: String,
        instructions: usize,
    },
    #[error(
        "{file}: the {filter} filter does not start with seccompiler's architecture check; \
         cannot add the x32 kill"
    )]
    NoArchCheck { file: String, filter: String },
    #[error("{file}: cannot build the {filter} filter: {source}")]
    Bpf {
        file: String,
        filter: String,
        source: seccompiler::BackendError,
    },
    #[error("cannot install the {filter} seccomp filter: {source}")]
    Install {
        filter: String,
        source: seccompiler::Error,
    },
    #[error("{file}: profile does not convert to the OCI seccomp type: {source}")]
    Oci {
        file: String,
        source: serde_json::Error,
    },
}

/// Reads and parses a profile: the file at `path`, or the embedded default
/// when `path` is `None`. Returns the parsed profile and the raw JSON text.
pub fn load_profile(path: Option<&Path>) -> Result<(Profile, String), SeccompError> {
    let (file, raw) = match path {
        None => (
            DEFAULT_PROFILE_NAME.to_string(),
            DEFAULT_PROFILE.to_string(),
        ),
        Some(p) => {
            let raw = std::fs::read_to_string(p).map_err(|source| SeccompError::Read {
                path: p.to_path_buf(),
                source,
            })?;
            (p.display().to_string(), raw)
        }
    };
    let profile = Profile::parse(&raw, &file)?;
    Ok((profile, raw))
}

/// What the daemon calls at start-up: load, parse and compile the profile.
/// Any error must stop the start-up; it names the file, the entry and why.
pub fn load_and_compile(
    path: Option<&Path>,
) -> Result<(Profile, String, CompiledFilters), SeccompError> {
    let (profile, raw) = load_profile(path)?;
    let filters = compile(&profile)?;
    Ok((profile, raw, filters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_loads_and_compiles() {
        let (profile, raw, filters) = load_and_compile(None).unwrap();
        assert_eq!(raw, DEFAULT_PROFILE);
        assert_eq!(profile.source, DEFAULT_PROFILE_NAME);
        assert_eq!(
            filters.filters.len(),
            4,
            "allow-list + EPERM, EAFNOSUPPORT and EPROTONOSUPPORT deny filters"
        );
        for f in &filters.filters {
            assert!(f.program.len() < 4096, "{} too large", f.name);
        }
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = load_profile(Some(Path::new("/nonexistent/profile.json"))).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/profile.json"),
            "{err}"
        );
    }
}
