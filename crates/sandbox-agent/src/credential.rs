//! The per-incarnation credential every request must carry (Kubernetes
//! backend; see `sandbox_abi::credential` and `docs/security.md`).
//!
//! [`Credential::take_from_env`] runs in `main` while the agent is still
//! single-threaded: it copies the value of `SANDBOX_AGENT_CREDENTIAL`,
//! overwrites the value's bytes in the process's environment block with
//! zeros (so `/proc/<agent>/environ`, which shows that block, no longer
//! holds it, not even to root), and removes the variable, so no command
//! inherits it. The agent never writes it anywhere.
//!
//! Owns: the check of one request's header. Must not: log the credential
//! or what a client presented.

use std::ffi::{CStr, CString};

use hyper::{HeaderMap, Response, StatusCode};
use sandbox_abi::credential::{constant_time_eq, ENV, HEADER, MIN_LEN};

use super::body::AgentBody;
use super::envelope::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{ENV} is shorter than {MIN_LEN} bytes")]
    TooShort,
    #[error("{ENV} is not set, and --require-credential was given")]
    Missing,
}

/// The credential, held only in the agent's memory.
pub struct Credential(Box<[u8]>);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

impl Credential {
    /// A credential from bytes (tests, and [`Credential::take_from_env`]).
    pub fn new(bytes: &[u8]) -> Result<Credential, CredentialError> {
        if bytes.len() < MIN_LEN {
            return Err(CredentialError::TooShort);
        }
        Ok(Credential(bytes.into()))
    }

    /// Takes the credential out of the environment (see the module
    /// documentation); `None` when the variable is not set. Must be called
    /// while the process is single-threaded.
    pub fn take_from_env() -> Result<Option<Credential>, CredentialError> {
        let name = CString::new(ENV).expect("no NUL in the name");
        // SAFETY: `name` is NUL-terminated; the process is single-threaded
        // (the documented precondition), so nothing changes the environment
        // while the returned pointer is used.
        let value = unsafe { libc::getenv(name.as_ptr()) };
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: getenv returned a non-null pointer to the NUL-terminated
        // value inside the environment block, valid until the environment
        // is changed, which only this function does, below.
        let len = unsafe { CStr::from_ptr(value) }.to_bytes().len();
        // SAFETY: as above; the slice is dropped (copied) before the bytes
        // are overwritten.
        let copy = Credential::new(unsafe { CStr::from_ptr(value) }.to_bytes());
        for i in 0..len {
            // SAFETY: `value[0..len]` are the value's bytes, writable memory
            // of this process's environment block (the initial stack area,
            // or a heap copy made by setenv); single-threaded, so no reader
            // races with the write. The terminating NUL is kept.
            unsafe { std::ptr::write_volatile(value.add(i), 0) };
        }
        std::env::remove_var(ENV);
        copy.map(Some)
    }

    /// Checks the request's header: `Err` is the response to send instead
    /// (401 without the header, 403 with another value).
    #[allow(clippy::result_large_err)]
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Response<AgentBody>> {
        let refuse = |status: StatusCode, message: &str| {
            ApiError {
                status,
                message: message.to_string(),
            }
            .into_response()
        };
        match headers.get(HEADER) {
            None => Err(refuse(StatusCode::UNAUTHORIZED, "missing agent credential")),
            Some(v) if constant_time_eq(v.as_bytes(), &self.0) => Ok(()),
            Some(_) => Err(refuse(StatusCode::FORBIDDEN, "invalid agent credential")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_the_header() {
        let c = Credential::new(&[b'a'; 64]).unwrap();
        assert!(Credential::new(b"short").is_err());
        let mut h = HeaderMap::new();
        assert_eq!(c.check(&h).unwrap_err().status(), StatusCode::UNAUTHORIZED);
        h.insert(HEADER, "b".repeat(64).parse().unwrap());
        assert_eq!(c.check(&h).unwrap_err().status(), StatusCode::FORBIDDEN);
        h.insert(HEADER, "a".repeat(64).parse().unwrap());
        assert!(c.check(&h).is_ok());
        assert_eq!(format!("{c:?}"), "Credential(<redacted>)");
    }
}
