//! Operator and auditor subcommands of the `sandboxd` binary. Each module
//! parses its arguments with clap and calls the library; no logic lives here.

pub mod seccomp;
