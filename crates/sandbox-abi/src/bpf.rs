//! The compiled seccomp filter stack as the daemon hands it to the
//! launcher: the daemon compiles the profile once at start
//! (`sandbox-seccomp`), writes the stack in this format to
//! `<state_dir>/seccomp.bpf` and names the file in every launch
//! ([`SECCOMP_BPF_ARG`](crate::handoff::SECCOMP_BPF_ARG)); the launcher
//! reads it ([`read`]), decodes it ([`decode`]) and installs it last
//! ([`install`]), without a profile parser or compiler of its own.
//!
//! Format (little-endian): the magic [`MAGIC`], the number of filters
//! (u32), then per filter in install order its name (u32 length, UTF-8
//! bytes) and its program (u32 instruction count, then 8 bytes per
//! instruction: u16 code, u8 jt, u8 jf, u32 k). Nothing may follow.
//! [`decode`] refuses anything else (a wrong magic, a truncated file, an
//! empty or oversized program), so a damaged file fails the launch rather
//! than installing less than the profile.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The first bytes of an encoded filter stack (format version 1).
pub const MAGIC: &[u8; 8] = b"SBXBPF1\n";

/// The kernel's limit on the instructions of one program (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = 4096;

/// One BPF instruction, laid out as the kernel's `struct sock_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// One filter ready to install: its name (for errors) and program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub name: String,
    pub program: Vec<Instruction>,
}

/// Why a stack could not be read, decoded or installed.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// Displayed as `sandbox-seccomp`'s profile errors are: file, reason.
    #[error("{origin}: not a compiled filter stack: {reason}")]
    Format { origin: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot install the {filter} seccomp filter: {source}")]
    Install {
        filter: String,
        source: std::io::Error,
    },
}

/// Encodes `filters` (name, program) in install order.
pub fn encode<'a>(filters: impl ExactSizeIterator<Item = (&'a str, &'a [Instruction])>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(filters.len() as u32).to_le_bytes());
    for (name, program) in filters {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(program.len() as u32).to_le_bytes());
        for i in program {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
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
pub fn decode(bytes: &[u8], origin: &str) -> Result<Vec<Program>, BpfError> {
    let bad = |reason: String| BpfError::Format {
        origin: origin.to_string(),
        reason,
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
            .map(|c| Instruction {
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

/// Reads and decodes the stack at `path`, opened without following a
/// symlink in its last component (the daemon writes it root's only,
/// `0600`, in its state directory, beside the bundles: it is trusted as
/// much as a bundle's `config.json`).
pub fn read(path: &Path) -> Result<Vec<Program>, BpfError> {
    let shown = path.display().to_string();
    let mut bytes = Vec::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| BpfError::Read {
            path: shown.clone(),
            source,
        })?;
    decode(&bytes, &shown)
}

/// Installs one program: `seccomp(SECCOMP_SET_MODE_FILTER, 0, prog)`
/// after `PR_SET_NO_NEW_PRIVS` (the calls `seccompiler::apply_filter`
/// makes, so the daemon's compiler and this loader install alike).
pub fn install_one(program: &[Instruction]) -> std::io::Result<()> {
    if program.is_empty() || program.len() > MAX_INSTRUCTIONS {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `Instruction` has the layout of `struct sock_filter`
    // (repr(C): u16, u8, u8, u32); `prog` points at `program`, which
    // outlives the call; the kernel copies the program and does not
    // write to it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Installs the stack in order: each filter is added on top of the ones
/// before it.
pub fn install(programs: &[Program]) -> Result<(), BpfError> {
    for p in programs {
        install_one(&p.program).map_err(|source| BpfError::Install {
            filter: p.name.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack() -> Vec<u8> {
        let allow = [Instruction {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        }];
        let long = vec![
            Instruction {
                code: 0x20,
                jt: 1,
                jf: 2,
                k: 4,
            };
            300
        ];
        encode([("allow", &allow[..]), ("second", &long[..])].into_iter())
    }

    #[test]
    fn a_stack_round_trips() {
        let b = stack();
        let back = decode(&b, "t").unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].name, "allow");
        assert_eq!(back[0].program[0].k, 0x7fff_0000);
        assert_eq!(back[1].program.len(), 300);
        assert_eq!(
            encode(back.iter().map(|p| (p.name.as_str(), &p.program[..]))),
            b
        );
    }

    #[test]
    fn damaged_bytes_are_refused() {
        let bytes = stack();
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

    #[test]
    fn read_refuses_a_symlink_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.bpf");
        std::fs::write(&real, stack()).unwrap();
        assert_eq!(read(&real).unwrap().len(), 2);
        let link = dir.path().join("seccomp.bpf");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = read(&link).unwrap_err().to_string();
        assert!(
            e.contains("seccomp.bpf") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn instruction_has_the_kernel_layout() {
        assert_eq!(
            std::mem::size_of::<Instruction>(),
            std::mem::size_of::<libc::sock_filter>()
        );
        assert_eq!(
            std::mem::align_of::<Instruction>(),
            std::mem::align_of::<libc::sock_filter>()
        );
    }
}
