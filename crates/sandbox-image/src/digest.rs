//! Content digests (`sha256:<64 hex>`, the only algorithm accepted) and the
//! hashing reader and writer every byte of an image passes through.

use std::fmt;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

/// A validated `sha256:<64 lowercase hex>` digest. Any other algorithm or
/// spelling is refused, so a digest is always safe as a file name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a sha256 digest (sha256:<64 lowercase hex digits>)")]
pub struct BadDigest(pub String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest, BadDigest> {
        let ok = s.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if ok {
            Ok(Digest(s.to_string()))
        } else {
            Err(BadDigest(s.to_string()))
        }
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(h: Sha256) -> Digest {
        let out = h.finalize();
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in out {
            s.push_str(&format!("{b:02x}"));
        }
        Digest(s)
    }

    /// The 64 hex digits (a file name).
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for logs and listings.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Hashes and counts what is read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads what is left (trailing bytes after the end of a tar archive
    /// count too), then returns the digest and the byte count.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest::from_hasher(self.hasher), self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Hashes and counts what is written through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn finish(self) -> (W, Digest, u64) {
        (self.inner, Digest::from_hasher(self.hasher), self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// An incremental hash for async streams.
#[derive(Default)]
pub struct Hasher {
    hasher: Sha256,
    count: u64,
}

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.count += bytes.len() as u64;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn finish(self) -> (Digest, u64) {
        (Digest::from_hasher(self.hasher), self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_hash() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        for bad in [
            "sha512:00",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../etc",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
        let mut r = HashingReader::new(&b"abc"[..]);
        let mut one = [0u8; 1];
        r.read_exact(&mut one).unwrap();
        let (d, n) = r.finish().unwrap();
        assert_eq!((d, n), (Digest::of(b"abc"), 3));
    }
}
