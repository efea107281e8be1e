//! Bearer-token authentication: loading (configured, token file, or
//! generated once and stored 0600 in the state dir) and constant-time
//! checking.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;
use tracing::info;

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the API token is {0} characters; at least {MIN_TOKEN_LEN} are required")]
    TooShort(usize),
    #[error("the API token has surrounding white space")]
    WhiteSpace,
    #[error("cannot read token file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot store generated token in {path}: {source}")]
    Store {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds the API token but its mode is {mode:04o} (readable or writable by group or others): run `chmod 600 {path}`")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("{path} holds the API token but is owned by uid {uid}, not root: run `chown root:root {path}`")]
    NotOwned { path: PathBuf, uid: u32 },
    #[error("cannot check {path}: {source}")]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Refuses a file holding the token (the config file with `token`, the
/// `token_file`, the stored token) that is not root's (or, for a daemon not
/// run as root, its own user's) or that group or others may read or write.
pub fn check_secret_file(path: &Path) -> Result<(), AuthError> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).map_err(|source| AuthError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != 0 && md.uid() != me {
        return Err(AuthError::NotOwned {
            path: path.to_path_buf(),
            uid: md.uid(),
        });
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(AuthError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// The configured token. `Debug` never prints it.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Validates a token value.
    pub fn new(value: String) -> Result<Token, AuthError> {
        if value.trim() != value {
            return Err(AuthError::WhiteSpace);
        }
        if value.chars().count() < MIN_TOKEN_LEN {
            return Err(AuthError::TooShort(value.chars().count()));
        }
        Ok(Token(value))
    }

    /// The token value (for the operator CLI talking to the local API).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Checks an `Authorization` header value in constant time (with
    /// respect to the token's content).
    pub fn check(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else { return false };
        let Some(given) = h.strip_prefix(b"Bearer ") else {
            return false;
        };
        let want = self.0.as_bytes();
        // As `[u8]::ct_eq`, which also answers a length mismatch at once,
        // but eight bytes a step (this runs on every proxied request).
        if given.len() != want.len() {
            return false;
        }
        let (given_words, want_words) = (given.chunks_exact(8), want.chunks_exact(8));
        let mut same = given_words.remainder().ct_eq(want_words.remainder());
        for (g, w) in given_words.zip(want_words) {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("eight bytes"));
            same &= word(g).ct_eq(&word(w));
        }
        same.into()
    }
}

/// Resolves the token: the configured value, else the token file, else the
/// one stored in `<state_dir>/token` (generated on first start).
pub fn load_token(
    configured: Option<&str>,
    token_file: Option<&Path>,
    state_dir: &Path,
) -> Result<Token, AuthError> {
    if let Some(v) = configured {
        return Token::new(v.to_string());
    }
    if let Some(path) = token_file {
        check_secret_file(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        // A trailing newline is how editors save files; anything else is
        // refused as white space.
        let text = text.strip_suffix('\n').unwrap_or(&text);
        return Token::new(text.to_string());
    }
    let path = state_dir.join("token");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            check_secret_file(&path)?;
            info!(path = %path.display(), "using the API token stored in the state dir");
            Token::new(text.trim_end_matches('\n').to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = generate();
            store(&path, &value).map_err(|source| AuthError::Store {
                path: path.clone(),
                source,
            })?;
            info!(path = %path.display(), "no API token configured: generated one and stored it (mode 0600)");
            Token::new(value)
        }
        Err(source) => Err(AuthError::ReadFile { path, source }),
    }
}

fn generate() -> String {
    // 256 bits from the kernel's getrandom(2).
    let a = sandbox_abi::random::u128();
    let b = sandbox_abi::random::u128();
    format!("{a:032x}{b:032x}")
}

/// Writes the token atomically with mode 0600.
fn store(path: &Path, value: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".token.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(value.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(matches!(
            Token::new("short".into()),
            Err(AuthError::TooShort(5))
        ));
        assert!(matches!(
            Token::new(format!(" {}", "a".repeat(40))),
            Err(AuthError::WhiteSpace)
        ));
        let t = Token::new("a".repeat(32)).unwrap();
        assert!(t.check(Some(format!("Bearer {}", "a".repeat(32)).as_bytes())));
        assert!(!t.check(Some(format!("Bearer {}", "a".repeat(31)).as_bytes())));
        assert!(!t.check(Some(format!("bearer {}", "a".repeat(32)).as_bytes())));
        assert!(!t.check(None));
        assert!(!format!("{t:?}").contains("aaaa"));
    }

    /// A difference anywhere fails the check: in a whole word, in the
    /// bytes after the last, with tokens of every length around a word.
    #[test]
    fn every_byte_counts() {
        for len in 32..=41 {
            let token: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            let t = Token::new(token.clone()).unwrap();
            assert!(t.check(Some(format!("Bearer {token}").as_bytes())));
            for at in 0..len {
                let mut bad = token.clone().into_bytes();
                bad[at] ^= 1;
                let header = [b"Bearer ".as_slice(), &bad].concat();
                assert!(!t.check(Some(&header)), "len {len}, byte {at}");
            }
            assert!(!t.check(Some(format!("Bearer {token}x").as_bytes())));
            assert!(!t.check(Some(format!("Bearer {}", &token[1..]).as_bytes())));
        }
    }

    #[test]
    fn generated_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_token(None, None, dir.path()).unwrap();
        let b = load_token(None, None, dir.path()).unwrap();
        assert_eq!(a.expose(), b.expose());
        let mode = std::fs::metadata(dir.path().join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn generated_tokens_are_256_bits_of_hex_and_fresh() {
        let (a, b) = (generate(), generate());
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        // Both halves are drawn (an all-zero half would be 2^-128).
        assert_ne!(&a[..32], &"0".repeat(32));
        assert_ne!(&a[32..], &"0".repeat(32));
    }
}
