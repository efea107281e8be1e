//! Foreign syscall ABIs: every compiled stack kills them.
//!
//! An x86_64 process can enter the kernel through two other ABIs, each with
//! its own syscall numbers:
//! - **i386** (`int $0x80`, or a 32-bit binary): `seccomp_data.arch` is
//!   `AUDIT_ARCH_I386`. seccompiler starts every program with an
//!   architecture check that kills the process on any arch but x86_64.
//! - **x32** (a 64-bit call whose number has bit 30, `__X32_SYSCALL_BIT`,
//!   set): `seccomp_data.arch` is `AUDIT_ARCH_X86_64`, so the architecture
//!   check lets it through, and on its own the allow-list would answer
//!   ENOSYS (no x32 number is listed). [`kill_x32`] adds the check that
//!   libseccomp (runc) emits for an x86_64-only profile, so x32 calls are
//!   killed too: both ABIs meet the same fate, and the profile means the same
//!   thing to runc and to sandboxd.

use seccompiler::{sock_filter, BpfProgram};

/// `__X32_SYSCALL_BIT`.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/bpf_common.h; seccompiler does not export
// them): BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K,
// BPF_RET|BPF_K.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Inserts, right after seccompiler's architecture check (load arch, jump
/// over the kill if x86_64, kill), a check that kills the process when the
/// syscall number has the x32 bit set. Returns `false`, leaving `program`
/// untouched, when it does not start with that check.
pub fn kill_x32(program: &mut BpfProgram) -> bool {
    let prologue = [
        insn(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    if program.len() < prologue.len() || program[..prologue.len()] != prologue {
        return false;
    }
    // The arch check's "x86_64" branch lands on index 3: the first
    // instruction inserted here. Every later jump is relative and stays
    // within the code that follows, so nothing else moves.
    let x32 = [
        insn(BPF_LD_W_ABS, 0, 0, NR_OFFSET),
        insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    program.splice(prologue.len()..prologue.len(), x32);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};

    fn program() -> BpfProgram {
        let f = SeccompFilter::new(
            [(39, vec![])].into_iter().collect(),
            SeccompAction::Errno(38),
            SeccompAction::Allow,
            TargetArch::x86_64,
        )
        .unwrap();
        BpfProgram::try_from(f).unwrap()
    }

    #[test]
    fn inserts_the_x32_kill_after_the_arch_check() {
        let mut p = program();
        let before = p.clone();
        assert!(kill_x32(&mut p));
        assert_eq!(p.len(), before.len() + 3);
        assert_eq!(p[..3], before[..3]);
        assert_eq!(p[6..], before[3..]);
        assert_eq!(p[4].k, X32_SYSCALL_BIT);
        assert_eq!(p[5].k, libc::SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn refuses_a_program_without_the_arch_check() {
        let mut p = program();
        p.remove(0);
        let before = p.clone();
        assert!(!kill_x32(&mut p));
        assert_eq!(p, before);
    }
}
