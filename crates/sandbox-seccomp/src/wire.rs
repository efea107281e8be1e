//! The compiled filters as bytes: what the daemon writes once at start
//! (it compiled the profile already) and the launcher reads and installs
//! for every sandbox, instead of parsing the profile out of `config.json`
//! and compiling it again on each create.
//!
//! Format (little-endian): the magic [`MAGIC`], the number of filters
//! (u32), then per filter in install order its name (u32 length, UTF-8
//! bytes) and its program (u32 instruction count, then 8 bytes per
//! instruction: u16 code, u8 jt, u8 jf, u32 k). Nothing may follow.
//! [`decode`] refuses anything else (a wrong magic, a truncated file, an
//! empty or oversized program), so a damaged file fails the launch rather
//! than installing less than the profile.

use seccompiler::{sock_filter, BpfProgram};

use super::compile::{CompiledFilters, MAX_INSTRUCTIONS};
use super::SeccompError;

/// The first bytes of an encoded filter stack (format version 1).
pub const MAGIC: &[u8; 8] = b"SBXBPF1\n";

/// One filter ready to install: its name (for errors) and program.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub name: String,
    pub program: BpfProgram,
}

/// Encodes the stack in install order.
pub fn encode(filters: &CompiledFilters) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(filters.filters.len() as u32).to_le_bytes());
    for f in &filters.filters {
        out.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(&(f.program.len() as u32).to_le_bytes());
        for i in &f.program {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}

impl CompiledFilters {
    /// [`encode`].
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("truncated".into());
        }
        let (a, b) = self.bytes.split_at(n);
        self.bytes = b;
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Decodes what [`encode`] wrote; `origin` names the file in errors.
pub fn decode(bytes: &[u8], origin: &str) -> Result<Vec<Program>, SeccompError> {
    let bad = |reason: String| SeccompError::Profile {
        file: origin.to_string(),
        reason: format!("not a compiled filter stack: {reason}"),
    };
    let mut r = Reader { bytes };
    if r.take(MAGIC.len()).map_err(bad)? != MAGIC {
        return Err(bad("wrong magic".into()));
    }
    let count = r.u32().map_err(bad)?;
    if count == 0 {
        return Err(bad("no filter".into()));
    }
    let mut out = Vec::new();
    for _ in 0..count {
        let len = r.u32().map_err(bad)? as usize;
        let name = std::str::from_utf8(r.take(len).map_err(bad)?)
            .map_err(|_| bad("a name is not UTF-8".into()))?
            .to_string();
        let n = r.u32().map_err(bad)? as usize;
        if n == 0 || n >= MAX_INSTRUCTIONS {
            return Err(bad(format!("filter {name:?} has {n} instructions")));
        }
        let raw = r
            .take(n.checked_mul(8).ok_or_else(|| bad("size".into()))?)
            .map_err(bad)?;
        let program = raw
            .chunks_exact(8)
            .map(|c| sock_filter {
                code: u16::from_le_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        out.push(Program { name, program });
    }
    if !r.bytes.is_empty() {
        return Err(bad(format!(
            "{} bytes after the last filter",
            r.bytes.len()
        )));
    }
    Ok(out)
}

/// Installs decoded filters in order (see [`install`](super::install)).
pub fn install_programs(programs: &[Program]) -> Result<(), SeccompError> {
    for p in programs {
        seccompiler::apply_filter(&p.program).map_err(|source| SeccompError::Install {
            filter: p.name.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_stack_round_trips() {
        let (_, _, filters) = crate::load_and_compile(None).unwrap();
        let bytes = filters.to_bytes();
        let back = decode(&bytes, "t").unwrap();
        assert_eq!(back.len(), filters.filters.len());
        for (p, f) in back.iter().zip(&filters.filters) {
            assert_eq!(p.name, f.name);
            assert_eq!(p.program, f.program);
        }
    }

    #[test]
    fn damaged_bytes_are_refused() {
        let (_, _, filters) = crate::load_and_compile(None).unwrap();
        let bytes = filters.to_bytes();
        for (what, b) in [
            ("empty", Vec::new()),
            ("truncated", bytes[..bytes.len() - 3].to_vec()),
            ("trailing", [bytes.as_slice(), b"x"].concat()),
            ("magic", [b"SBXBPF2\n".as_slice(), &bytes[8..]].concat()),
            (
                "no filter",
                [MAGIC.as_slice(), &0u32.to_le_bytes()].concat(),
            ),
        ] {
            let e = decode(&b, "/state/seccomp.bpf").unwrap_err().to_string();
            assert!(
                e.contains("/state/seccomp.bpf") && e.contains("not a compiled filter stack"),
                "{what}: {e}"
            );
        }
    }
}
