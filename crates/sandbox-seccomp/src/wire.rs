//! The compiled filters as bytes: what the daemon writes once at start
//! (it compiled the profile already) and the launcher reads and installs
//! for every sandbox, instead of parsing the profile out of `config.json`
//! and compiling it again on each create. The format, its decoder and the
//! loader are `sandbox-abi`'s [`bpf`](sandbox_abi::bpf) (the launcher
//! links that, not this crate); this module encodes a compiled stack.

use seccompiler::BpfProgram;

pub use sandbox_abi::bpf::{Instruction, Program, MAGIC};

use super::compile::CompiledFilters;
use super::SeccompError;

/// The instructions of a program in the hand-off's layout.
pub fn instructions(program: &BpfProgram) -> Vec<Instruction> {
    program
        .iter()
        .map(|i| Instruction {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

/// The stack as the launcher installs it, in install order.
pub fn programs(filters: &CompiledFilters) -> Vec<Program> {
    filters
        .filters
        .iter()
        .map(|f| Program {
            name: f.name.clone(),
            program: instructions(&f.program),
        })
        .collect()
}

/// Encodes the stack in install order.
pub fn encode(filters: &CompiledFilters) -> Vec<u8> {
    let programs = programs(filters);
    sandbox_abi::bpf::encode(
        programs
            .iter()
            .map(|p| (p.name.as_str(), p.program.as_slice())),
    )
}

impl CompiledFilters {
    /// [`encode`].
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }
}

/// Decodes what [`encode`] wrote; `origin` names the file in errors.
pub fn decode(bytes: &[u8], origin: &str) -> Result<Vec<Program>, SeccompError> {
    sandbox_abi::bpf::decode(bytes, origin).map_err(|e| match e {
        sandbox_abi::bpf::BpfError::Format { origin, reason } => SeccompError::Profile {
            file: origin,
            reason: format!("not a compiled filter stack: {reason}"),
        },
        other => SeccompError::Profile {
            file: origin.to_string(),
            reason: other.to_string(),
        },
    })
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
            assert_eq!(p.program, instructions(&f.program));
        }
    }

    /// The bytes of the default profile's stack, pinned: what the daemon
    /// writes and every launch installs. Compiled before the launcher
    /// stopped linking the compiler (same sha256), so the filter a sandbox
    /// runs under did not change with it. A deliberate change of the
    /// profile or the compiler updates the digest here.
    #[test]
    fn the_default_stack_is_pinned() {
        use sha2::Digest;
        let (_, _, filters) = crate::load_and_compile(None).unwrap();
        let bytes = filters.to_bytes();
        assert_eq!(bytes.len(), 22028);
        let digest: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest,
            "24633765369d26b0e6da3685c4291d23b979c8f4c4f5d187f01635726ea1a86f"
        );
    }

    #[test]
    fn damaged_bytes_are_refused_with_sandbox_abis_message() {
        // The cases are sandbox-abi's (`bpf::tests`); this wrapper only
        // keeps its message.
        let (_, _, filters) = crate::load_and_compile(None).unwrap();
        let bytes = filters.to_bytes();
        let e = decode(&bytes[..bytes.len() - 3], "/state/seccomp.bpf")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/state/seccomp.bpf") && e.contains("not a compiled filter stack"),
            "{e}"
        );
    }
}
