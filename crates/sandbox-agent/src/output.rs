//! Collecting a command's combined output with size limits.
//!
//! Owns: the byte buffer, the truncation rule and the notice appended when
//! output was cut. Pure; no I/O.

/// Collects output up to `keep` bytes and counts the rest.
#[derive(Debug)]
pub struct OutputBuf {
    bytes: Vec<u8>,
    keep: usize,
    total: u64,
}

impl OutputBuf {
    /// A buffer that keeps at most `keep` bytes.
    pub fn new(keep: usize) -> Self {
        Self {
            bytes: Vec::new(),
            keep,
            total: 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.keep.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    /// The output as text (invalid UTF-8 replaced), cut at a character
    /// boundary, with a notice when bytes were dropped. `why` names the limit.
    pub fn into_text(self, why: &str) -> String {
        let truncated = self.truncated();
        let total = self.total;
        let mut text = String::from_utf8_lossy(&self.bytes).into_owned();
        if truncated {
            // A multi-byte character cut in half decodes to U+FFFD at the end.
            while text.ends_with('\u{FFFD}') {
                text.pop();
            }
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[sandbox-agent: output truncated to the first {} of {} bytes ({why})]\n",
                self.bytes.len(),
                total
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_everything_under_the_limit() {
        let mut b = OutputBuf::new(10);
        b.push(b"abc");
        b.push(b"def\n");
        assert!(!b.truncated());
        assert_eq!(b.into_text("x"), "abcdef\n");
    }

    #[test]
    fn truncates_and_says_so() {
        let mut b = OutputBuf::new(4);
        b.push(b"abcdef");
        b.push(b"gh");
        assert!(b.truncated());
        let t = b.into_text("limit 4 bytes");
        assert!(t.starts_with("abcd\n[sandbox-agent: output truncated to the first 4 of 8 bytes"));
        assert!(t.contains("limit 4 bytes"));
    }

    #[test]
    fn cuts_at_a_character_boundary() {
        let mut b = OutputBuf::new(4);
        b.push("aaé€".as_bytes()); // 'é' is 2 bytes, '€' 3: the cut falls inside '€'
        let t = b.into_text("x");
        assert!(t.starts_with("aaé\n["), "{t:?}");
    }

    #[test]
    fn invalid_utf8_is_replaced_not_rejected() {
        let mut b = OutputBuf::new(100);
        b.push(&[b'o', b'k', 0xff, b'\n']);
        assert_eq!(b.into_text("x"), "ok\u{FFFD}\n");
    }
}
