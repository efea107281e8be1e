//! The warm-pool claim: what the daemon sends a pool member's agent
//! (`sandbox-agent --pooled`) once, and what it answers (see the daemon's
//! `backend::native::pool` and the agent's `claim`).

use serde::{Deserialize, Serialize};

/// The internal path of the claim.
pub const CLAIM_PATH: &str = "/internal/claim";

/// The body of a claim.
#[derive(Debug, Deserialize, Serialize)]
pub struct ClaimRequest {
    /// Every command's environment, `KEY=VALUE` entries.
    pub env: Vec<String>,
    /// The working directory, an absolute path inside the sandbox.
    pub cwd: String,
}

/// Device and inode of a path, as `stat(2)` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// The answer to a claim.
#[derive(Debug, Deserialize, Serialize)]
pub struct ClaimAnswer {
    pub user_data: Option<FileId>,
    pub skills: Option<FileId>,
}
