//! The per-incarnation agent credential, defined once for the daemon (which
//! makes it, stores it and adds it to every proxied request) and the agent
//! (which reads it at start and refuses every request without it).
//!
//! The agent takes the credential from [`ENV`] while it is still
//! single-threaded, copies it into memory that a `fork` does not copy, wipes
//! the bytes of the variable in its initial environment block and removes
//! the variable, so neither its commands' environments nor `/proc/1/environ`
//! hold it (see `docs/security.md`). Requests carry it in [`HEADER`].

/// The variable through which the agent receives its credential (the
/// Kubernetes backend sets it from a Secret with `secretKeyRef`).
pub const ENV: &str = "SANDBOX_AGENT_CREDENTIAL";
/// The request header carrying the credential (the daemon's proxy sets it;
/// a client's own copy is dropped).
pub const HEADER: &str = "x-sandbox-agent-credential";
/// The key of the credential in the Kubernetes Secret.
pub const SECRET_KEY: &str = "credential";
/// The agent refuses shorter credentials.
pub const MIN_LEN: usize = 32;

/// A fresh credential: 256 random bits, 64 lowercase hex characters.
pub fn generate() -> String {
    let bytes: [u8; 32] = crate::random::bytes();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares `a` and `b` in time that depends only on their lengths (the
/// length of a credential is not secret: it is always 64).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_are_long_hex_and_distinct() {
        let a = generate();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, generate());
        assert!(a.len() >= MIN_LEN);
    }

    #[test]
    fn compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }
}
