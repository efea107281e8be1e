//! The device allow-list on cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE`
//! program built from a [`DevicePolicy`], loaded and attached to a
//! sandbox's cgroup with the `bpf(2)` system call (as runc and crun do).
//!
//! cgroup v2 has no `devices.*` files: for every open and `mknod` of a
//! device node, the kernel runs the device programs attached to the
//! task's v2 cgroup and its ancestors (attached with `BPF_F_ALLOW_MULTI`,
//! all of them must allow), before the v1 devices controller where one is
//! mounted. The program gets the device's type, major, minor and the
//! access asked for, and returns 1 (allow) or 0 (deny: `EPERM`).
//!
//! **Why hand-assembled, not aya (or libbpf).** The program is a short
//! straight line of compares, one block per exception of the policy, over
//! a dozen instruction kinds; the kernel's verifier checks it on every
//! load. What it takes is this file: the instruction encoding, three
//! `bpf(2)` commands (`BPF_PROG_LOAD`, `BPF_PROG_ATTACH`,
//! `BPF_PROG_QUERY`) and a small interpreter that the unit tests use to
//! check the program against the policy without a kernel. aya would bring
//! an eBPF object loader, ELF parsing, BTF and map handling, and their
//! dependencies, into the privileged daemon's address space (it runs as
//! root and creates every sandbox) for none of which this program has a
//! use; libbpf would add a C library. The launcher (`sandbox-init`) does
//! not link this crate, so its dependency budget is untouched.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::devices::{DeviceKind, DevicePolicy, ACCESS_ALL};

/// `BPF_PROG_LOAD`, `BPF_PROG_ATTACH`, `BPF_PROG_QUERY` (`enum bpf_cmd`).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_QUERY: libc::c_long = 16;
/// `BPF_PROG_TYPE_CGROUP_DEVICE` (`enum bpf_prog_type`).
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
/// `BPF_CGROUP_DEVICE` (`enum bpf_attach_type`).
const BPF_CGROUP_DEVICE: u32 = 6;
/// Every program attached to the cgroup and its ancestors runs; a
/// descendant cgroup can add programs but never drop this one.
const BPF_F_ALLOW_MULTI: u32 = 2;
/// The program's name as `bpftool cgroup tree` shows it (at most 15
/// bytes: letters, digits, `_` and `.`).
pub const PROGRAM_NAME: &str = "sandboxd_dev";
/// Licence string of the program: it calls no helper, so none is needed
/// by the kernel; the workspace's.
const LICENSE: &str = "Apache-2.0";
/// The largest major and minor a device can have (the kernel's `dev_t`:
/// 12 and 20 bits). An exception naming a larger one can never match.
const MAX_MAJOR: u32 = (1 << 12) - 1;
const MAX_MINOR: u32 = (1 << 20) - 1;

/// `struct bpf_cgroup_dev_ctx` type bits (`BPF_DEVCG_DEV_*`) and access
/// bits (`BPF_DEVCG_ACC_*`, shifted left 16 in `access_type`).
const DEV_BLOCK: u32 = 1;
const DEV_CHAR: u32 = 2;
pub const ACC_MKNOD: u8 = 1;
pub const ACC_READ: u8 = 2;
pub const ACC_WRITE: u8 = 4;

/// One eBPF instruction, laid out as the kernel's `struct bpf_insn`
/// (`dst_reg` in the low nibble of `regs` on little-endian hosts).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcodes: class | op | source.
const LDX_MEM_W: u8 = 0x61; // dst = *(u32 *)(src + off)
const ALU64_AND_K: u8 = 0x57; // dst &= imm
const ALU64_RSH_K: u8 = 0x77; // dst >>= imm
const ALU64_MOV_K: u8 = 0xb7; // dst = imm
const ALU64_MOV_X: u8 = 0xbf; // dst = src
const JMP_JEQ_K: u8 = 0x15; // if dst == imm goto +off
const JMP_JNE_K: u8 = 0x55; // if dst != imm goto +off
const JMP_EXIT: u8 = 0x95; // return r0

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// Registers after the prelude: r2 the device type, r3 the access asked
/// for, r4 the major, r5 the minor (r1, the context, is then scratch).
const R0: u8 = 0;
const R1: u8 = 1;
const R_TYPE: u8 = 2;
const R_ACCESS: u8 = 3;
const R_MAJOR: u8 = 4;
const R_MINOR: u8 = 5;

/// The program enforcing `policy`, as the v1 devices controller would:
/// with a default of deny, a request is allowed when one exception of its
/// type and numbers holds every access bit asked for; with a default of
/// allow, it is denied when one exception of its type and numbers shares
/// an access bit with the request.
pub fn device_program(policy: &DevicePolicy) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, R_TYPE, R1, 0, 0),
        insn(ALU64_AND_K, R_TYPE, 0, 0, 0xffff),
        insn(LDX_MEM_W, R_ACCESS, R1, 0, 0),
        insn(ALU64_RSH_K, R_ACCESS, 0, 0, 16),
        insn(LDX_MEM_W, R_MAJOR, R1, 4, 0),
        insn(LDX_MEM_W, R_MINOR, R1, 8, 0),
    ];
    let on_match = i32::from(!policy.default_allow);
    for ex in &policy.exceptions {
        if ex.major.is_some_and(|m| m > MAX_MAJOR) || ex.minor.is_some_and(|m| m > MAX_MINOR) {
            continue;
        }
        let kind = match ex.kind {
            DeviceKind::Block => DEV_BLOCK,
            DeviceKind::Char => DEV_CHAR,
        };
        // Each test jumps past the block when it fails.
        let mut block: Vec<Insn> = Vec::new();
        let mut jumps: Vec<usize> = Vec::new();
        let mut test = |block: &mut Vec<Insn>, code: u8, dst: u8, imm: i32| {
            jumps.push(block.len());
            block.push(insn(code, dst, 0, 0, imm));
        };
        test(&mut block, JMP_JNE_K, R_TYPE, kind as i32);
        if policy.default_allow {
            // Denied if the request shares a bit with the exception.
            block.push(insn(ALU64_MOV_X, R1, R_ACCESS, 0, 0));
            block.push(insn(ALU64_AND_K, R1, 0, 0, i32::from(ex.access)));
            test(&mut block, JMP_JEQ_K, R1, 0);
        } else if ex.access != ACCESS_ALL {
            // Allowed only if every bit asked for is in the exception.
            block.push(insn(ALU64_MOV_X, R1, R_ACCESS, 0, 0));
            block.push(insn(
                ALU64_AND_K,
                R1,
                0,
                0,
                i32::from(!ex.access & ACCESS_ALL),
            ));
            test(&mut block, JMP_JNE_K, R1, 0);
        }
        if let Some(major) = ex.major {
            test(&mut block, JMP_JNE_K, R_MAJOR, major as i32);
        }
        if let Some(minor) = ex.minor {
            test(&mut block, JMP_JNE_K, R_MINOR, minor as i32);
        }
        block.push(insn(ALU64_MOV_K, R0, 0, 0, on_match));
        block.push(insn(JMP_EXIT, 0, 0, 0, 0));
        let end = block.len();
        for j in jumps {
            block[j].off = (end - j - 1) as i16;
        }
        p.extend(block);
    }
    p.push(insn(ALU64_MOV_K, R0, 0, 0, i32::from(policy.default_allow)));
    p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    p
}

/// Why a device program could not be loaded, attached or queried.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("cannot load the BPF device program: {source}{}", verifier_log(.log))]
    Load { source: std::io::Error, log: String },
    #[error("cannot open cgroup {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot attach the BPF device program to {path}: {source}")]
    Attach {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot list the BPF device programs of {path}: {source}")]
    Query {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

fn verifier_log(log: &str) -> String {
    let log = log.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    if log.is_empty() {
        String::new()
    } else {
        format!(" (verifier: {log})")
    }
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// `union bpf_attr` for `BPF_PROG_QUERY`, up to `prog_cnt`.
#[repr(C)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

/// `bpf(cmd, attr, sizeof attr)`.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a `#[repr(C)]` prefix of `union bpf_attr` for
    // `cmd`, fully initialised (padding included: every caller builds it
    // from `zeroed`), and lives across the call; the pointers inside it
    // point at buffers of the caller that outlive the call, with their
    // lengths. The kernel reads `size_of::<T>()` bytes and writes only
    // output fields of the same struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Loads `program` as a cgroup device program; the returned fd keeps it
/// alive (each cgroup it is attached to holds it too). On failure the
/// kernel's verifier log is in the error.
pub fn load(program: &[Insn]) -> Result<OwnedFd, BpfError> {
    let license = CString::new(LICENSE).expect("no NUL");
    let attempt = |log: Option<&mut Vec<u8>>| {
        // SAFETY: an all-zero `ProgLoadAttr` is valid (integers and a
        // byte array), and is what the kernel expects for unused fields.
        let mut attr: ProgLoadAttr = unsafe { std::mem::zeroed() };
        attr.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
        attr.insn_cnt = program.len() as u32;
        attr.insns = program.as_ptr() as u64;
        attr.license = license.as_ptr() as u64;
        attr.expected_attach_type = BPF_CGROUP_DEVICE;
        attr.prog_name[..PROGRAM_NAME.len()].copy_from_slice(PROGRAM_NAME.as_bytes());
        if let Some(buf) = log {
            attr.log_level = 1;
            attr.log_size = buf.len() as u32;
            attr.log_buf = buf.as_mut_ptr() as u64;
        }
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    let fd = match attempt(None) {
        Ok(fd) => fd,
        Err(source) => {
            // Again with the verifier's log, for the error.
            let mut buf = vec![0u8; 64 * 1024];
            let _ = attempt(Some(&mut buf));
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            return Err(BpfError::Load {
                source,
                log: String::from_utf8_lossy(&buf[..end]).into_owned(),
            });
        }
    };
    // SAFETY: the kernel just returned this fd (O_CLOEXEC) to us; nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether this kernel loads a device program (`CONFIG_CGROUP_BPF`, and
/// the privilege to): loads one that denies everything, and drops it.
pub fn probe() -> Result<(), BpfError> {
    let deny_all = DevicePolicy {
        default_allow: false,
        exceptions: Vec::new(),
    };
    load(&device_program(&deny_all)).map(drop)
}

fn open_dir(path: &Path) -> Result<std::fs::File, BpfError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| BpfError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// Attaches the loaded device program `prog` to the v2 cgroup directory
/// `cgroup` with `BPF_F_ALLOW_MULTI`. The attachment lasts as long as the
/// cgroup (not the fds): a daemon restart keeps it.
pub fn attach(cgroup: &Path, prog: &OwnedFd) -> Result<(), BpfError> {
    let dir = open_dir(cgroup)?;
    let mut attr = ProgAttachAttr {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    bpf(BPF_PROG_ATTACH, &mut attr)
        .map(drop)
        .map_err(|source| BpfError::Attach {
            path: cgroup.to_path_buf(),
            source,
        })
}

/// The ids of the device programs attached to the v2 cgroup directory
/// `cgroup` itself (not its ancestors').
pub fn attached(cgroup: &Path) -> Result<Vec<u32>, BpfError> {
    let dir = open_dir(cgroup)?;
    let mut ids = vec![0u32; 64];
    // SAFETY: all-zero is a valid `ProgQueryAttr` (integers only).
    let mut attr: ProgQueryAttr = unsafe { std::mem::zeroed() };
    attr.target_fd = dir.as_raw_fd() as u32;
    attr.attach_type = BPF_CGROUP_DEVICE;
    attr.prog_ids = ids.as_mut_ptr() as u64;
    attr.prog_cnt = ids.len() as u32;
    bpf(BPF_PROG_QUERY, &mut attr).map_err(|source| BpfError::Query {
        path: cgroup.to_path_buf(),
        source,
    })?;
    ids.truncate(attr.prog_cnt as usize);
    Ok(ids)
}

/// Runs `program` as the kernel would on a device request (a subset of
/// eBPF: the instructions [`device_program`] emits). For tests: checks
/// the program against [`DevicePolicy::allows`] without a kernel.
#[cfg(test)]
pub(crate) fn interpret(
    program: &[Insn],
    kind: DeviceKind,
    major: u32,
    minor: u32,
    access: u8,
) -> u64 {
    let typ = match kind {
        DeviceKind::Block => DEV_BLOCK,
        DeviceKind::Char => DEV_CHAR,
    };
    let ctx = [(u32::from(access) << 16) | typ, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    loop {
        let i = program[pc];
        let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
        let imm = i.imm as i64 as u64;
        pc += 1;
        let jump = |cond: bool, pc: &mut usize| {
            if cond {
                *pc = (*pc as i64 + i64::from(i.off)) as usize;
            }
        };
        match i.code {
            LDX_MEM_W => {
                assert_eq!(src, 1, "loads only from the context");
                r[dst] = u64::from(ctx[(i.off / 4) as usize]);
            }
            ALU64_AND_K => r[dst] &= imm,
            ALU64_RSH_K => r[dst] >>= imm,
            ALU64_MOV_K => r[dst] = imm,
            ALU64_MOV_X => r[dst] = r[src],
            JMP_JEQ_K => jump(r[dst] == imm, &mut pc),
            JMP_JNE_K => jump(r[dst] != imm, &mut pc),
            JMP_EXIT => return r[0],
            other => panic!("unexpected opcode {other:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::DeviceException;
    use proptest::prelude::*;

    const KINDS: [DeviceKind; 2] = [DeviceKind::Block, DeviceKind::Char];
    const NUMBERS: [u32; 4] = [0, 1, 3, 136];

    /// Every request over a few numbers: the program answers as the policy.
    fn agrees(policy: &DevicePolicy) {
        let prog = device_program(policy);
        for kind in KINDS {
            for major in NUMBERS {
                for minor in NUMBERS {
                    for access in 1..=ACCESS_ALL {
                        let want = policy.allows(kind, major, minor, access);
                        let got = interpret(&prog, kind, major, minor, access);
                        assert_eq!(
                            got,
                            u64::from(want),
                            "{kind:?} {major}:{minor} access {access:03b} under {policy:?}"
                        );
                    }
                }
            }
        }
    }

    fn exception() -> impl Strategy<Value = DeviceException> {
        let num = prop_oneof![
            Just(None),
            proptest::sample::select(&NUMBERS[..]).prop_map(Some)
        ];
        (
            proptest::sample::select(&KINDS[..]),
            num.clone(),
            num,
            1..=ACCESS_ALL,
        )
            .prop_map(|(kind, major, minor, access)| DeviceException {
                kind,
                major,
                minor,
                access,
            })
    }

    proptest! {
        #[test]
        fn the_program_decides_as_the_policy(
            default_allow in any::<bool>(),
            exceptions in proptest::collection::vec(exception(), 0..6),
        ) {
            agrees(&DevicePolicy { default_allow, exceptions });
        }
    }

    #[test]
    fn fixed_cases() {
        agrees(&DevicePolicy {
            default_allow: false,
            exceptions: vec![],
        });
        agrees(&DevicePolicy {
            default_allow: true,
            exceptions: vec![],
        });
        let p = DevicePolicy {
            default_allow: false,
            exceptions: vec![DeviceException {
                kind: DeviceKind::Char,
                major: Some(136),
                minor: None,
                access: ACCESS_ALL,
            }],
        };
        agrees(&p);
        // rwm needs no access test: type, major, r0 = 1, exit.
        assert_eq!(device_program(&p).len(), 6 + 4 + 2);
    }

    /// A major or minor no device can have: the exception is left out
    /// (it could never match), the rest stays.
    #[test]
    fn impossible_numbers_are_left_out() {
        let ex = |major| DeviceException {
            kind: DeviceKind::Char,
            major: Some(major),
            minor: None,
            access: ACCESS_ALL,
        };
        let with = DevicePolicy {
            default_allow: false,
            exceptions: vec![ex(1), ex(MAX_MAJOR + 1)],
        };
        let without = DevicePolicy {
            default_allow: false,
            exceptions: vec![ex(1)],
        };
        assert_eq!(device_program(&with), device_program(&without));
    }
}
