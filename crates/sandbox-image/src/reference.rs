//! Image references (`[registry/]repository[:tag][@sha256:...]`), normalized
//! the way the distribution spec's clients do (`busybox` is
//! `docker.io/library/busybox:latest`), so the reference index has one key
//! per image name.

use oci_client::Reference;

/// Parses `s` as an image reference.
pub fn parse(s: &str) -> Result<Reference, String> {
    s.trim()
        .parse::<Reference>()
        .map_err(|e| format!("{s:?} is not an image reference: {e}"))
}

/// The normalized spelling of `s`.
pub fn normalize(s: &str) -> Result<String, String> {
    parse(s).map(|r| r.whole())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(
            normalize("busybox").unwrap(),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            normalize("127.0.0.1:5000/t/bb:1").unwrap(),
            "127.0.0.1:5000/t/bb:1"
        );
        assert!(normalize("has space").is_err());
        assert!(normalize("").is_err());
    }
}
