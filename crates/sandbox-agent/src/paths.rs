//! Turning a path from a request into an absolute, lexically normalized path.
//!
//! Relative paths resolve against the agent's working directory, `~` against
//! its home. Normalization is lexical (`.` dropped, `..` pops) so listings
//! show the paths the caller named, not symlink targets. The agent runs as
//! the sandbox user, so the kernel's permission checks are the access
//! control; this module does no sandboxing of its own.

use std::path::{Component, Path, PathBuf};

/// Where relative paths and `~` resolve.
#[derive(Debug, Clone)]
pub struct PathBase {
    pub cwd: PathBuf,
    pub home: PathBuf,
}

impl PathBase {
    /// Resolves `raw` to an absolute normalized path.
    pub fn resolve(&self, raw: &str) -> PathBuf {
        let joined = if raw == "~" {
            self.home.clone()
        } else if let Some(rest) = raw.strip_prefix("~/") {
            self.home.join(rest)
        } else if Path::new(raw).is_absolute() {
            PathBuf::from(raw)
        } else {
            self.cwd.join(raw)
        };
        normalize(&joined)
    }
}

/// Lexical normalization of an absolute path: no `.`, no `..`, no `//`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(c) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> PathBase {
        PathBase {
            cwd: PathBuf::from("/home/gem/work"),
            home: PathBuf::from("/home/gem"),
        }
    }

    #[test]
    fn resolves_relative_home_and_dots() {
        let b = base();
        assert_eq!(b.resolve("a/b.txt"), Path::new("/home/gem/work/a/b.txt"));
        assert_eq!(b.resolve("~/x"), Path::new("/home/gem/x"));
        assert_eq!(b.resolve("~"), Path::new("/home/gem"));
        assert_eq!(b.resolve("/tmp//a/./b/../c/"), Path::new("/tmp/a/c"));
        assert_eq!(b.resolve("/../.."), Path::new("/"));
        assert_eq!(b.resolve("../up"), Path::new("/home/gem/up"));
    }
}
