//! Process-level steps of the launcher: loopback, rlimits, fds, user and
//! capabilities.

use std::os::fd::RawFd;

use crate::spec::{PosixRlimit, PosixRlimitType, User};
use caps::CapSet;
use nix::sys::resource::{setrlimit, Resource};

use super::InitError;

/// Brings `lo` up in the (new, empty) network namespace: the agent listens
/// on 127.0.0.1 there and nothing else exists.
pub fn loopback_up() -> Result<(), InitError> {
    let e = |m: String| InitError::Loopback(m);
    // SAFETY: plain socket(2) call; the returned fd is checked and closed.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(e(format!("socket: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `req`
    // into `req`, which lives for the duration of the call.
    let r = unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) };
    let result = if r < 0 {
        Err(e(format!(
            "SIOCGIFFLAGS: {}",
            std::io::Error::last_os_error()
        )))
    } else {
        // SAFETY: the union member written by SIOCGIFFLAGS is ifru_flags.
        unsafe {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        // SAFETY: SIOCSIFFLAGS reads `req`, valid for the call.
        let r = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &req) };
        if r < 0 {
            Err(e(format!(
                "SIOCSIFFLAGS: {}",
                std::io::Error::last_os_error()
            )))
        } else {
            Ok(())
        }
    };
    // SAFETY: `sock` is ours and closed exactly once.
    unsafe { libc::close(sock) };
    result
}

/// Writes `/proc/self/oom_score_adj` (the `/proc` of the sandbox's own PID
/// namespace). Lowering it needs `CAP_SYS_RESOURCE`, so this runs as root.
/// A host that withholds that capability even from root (some container
/// hosts do) refuses with EACCES: the payload then keeps the inherited
/// score (a warning in the sandbox's log) and the agent still keeps its
/// commands above itself (see the agent's exec).
pub fn set_oom_score_adj(score: i32) -> Result<(), InitError> {
    match std::fs::write("/proc/self/oom_score_adj", score.to_string()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!(
                "sandbox-init: warning: cannot set oom_score_adj to {score} \
                 (no CAP_SYS_RESOURCE on this host): {e}"
            );
            Ok(())
        }
        Err(e) => Err(InitError::OomScoreAdj(format!(
            "/proc/self/oom_score_adj = {score}: {e}"
        ))),
    }
}

fn resource(t: PosixRlimitType) -> Option<Resource> {
    use PosixRlimitType as T;
    Some(match t {
        T::RlimitCpu => Resource::RLIMIT_CPU,
        T::RlimitFsize => Resource::RLIMIT_FSIZE,
        T::RlimitData => Resource::RLIMIT_DATA,
        T::RlimitStack => Resource::RLIMIT_STACK,
        T::RlimitCore => Resource::RLIMIT_CORE,
        T::RlimitRss => Resource::RLIMIT_RSS,
        T::RlimitNproc => Resource::RLIMIT_NPROC,
        T::RlimitNofile => Resource::RLIMIT_NOFILE,
        T::RlimitMemlock => Resource::RLIMIT_MEMLOCK,
        T::RlimitAs => Resource::RLIMIT_AS,
        T::RlimitLocks => Resource::RLIMIT_LOCKS,
        T::RlimitSigpending => Resource::RLIMIT_SIGPENDING,
        T::RlimitMsgqueue => Resource::RLIMIT_MSGQUEUE,
        T::RlimitNice => Resource::RLIMIT_NICE,
        T::RlimitRtprio => Resource::RLIMIT_RTPRIO,
        T::RlimitRttime => Resource::RLIMIT_RTTIME,
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

pub fn set_rlimits(limits: &[PosixRlimit]) -> Result<(), InitError> {
    for l in limits {
        let r = resource(l.typ())
            .ok_or_else(|| InitError::Rlimit(format!("{:?}: unsupported", l.typ())))?;
        match setrlimit(r, l.soft(), l.hard()) {
            Ok(()) => {}
            // Raising a hard limit needs CAP_SYS_RESOURCE, which some hosts
            // withhold even from root: clamp to the host's hard limit.
            Err(nix::errno::Errno::EPERM) => {
                let (_, host_hard) = nix::sys::resource::getrlimit(r)
                    .map_err(|e| InitError::Rlimit(format!("{:?}: {e}", l.typ())))?;
                eprintln!(
                    "sandbox-init: {:?} {}:{} is above the host's hard limit {host_hard}; clamped",
                    l.typ(),
                    l.soft(),
                    l.hard()
                );
                setrlimit(r, l.soft().min(host_hard), l.hard().min(host_hard))
                    .map_err(|e| InitError::Rlimit(format!("{:?}: {e}", l.typ())))?;
            }
            Err(e) => return Err(InitError::Rlimit(format!("{:?}: {e}", l.typ()))),
        }
    }
    Ok(())
}

/// Marks every fd from 3 up close-on-exec except `keep` (the ready pipe
/// the agent inherits). The report pipe is already CLOEXEC and stays
/// usable until exec.
pub fn close_other_fds(keep: Option<RawFd>) -> Result<(), InitError> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on fds
    // of this process; no memory is involved.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r < 0 {
        return Err(InitError::CloseFds(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    if let Some(fd) = keep {
        // SAFETY: F_SETFD on an fd number; an invalid fd only yields EBADF.
        let r = unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        if r < 0 {
            return Err(InitError::CloseFds(format!(
                "ready fd {fd}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Drops the capability sets a setuid does not clear by itself (ambient,
/// inheritable, bounding); needs CAP_SETPCAP, so it runs while still root.
pub fn drop_inheritable_caps() -> Result<(), InitError> {
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Bounding] {
        caps::clear(None, set).map_err(|e| InitError::DropCaps(format!("{set:?}: {e}")))?;
    }
    Ok(())
}

/// Switches to the spec's user: supplementary groups, gid, then uid (real,
/// effective and saved). A setuid away from root without KEEP_CAPS clears
/// the permitted and effective sets.
pub fn switch_user(user: &User, may_setgroups: bool) -> Result<(), InitError> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    let groups: Vec<Gid> = user
        .additional_gids()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(Gid::from_raw)
        .collect();
    if may_setgroups {
        setgroups(&groups).map_err(|e| InitError::SwitchUser(format!("setgroups: {e}")))?;
    } else {
        let left = nix::unistd::getgroups()
            .map_err(|e| InitError::SwitchUser(format!("getgroups: {e}")))?;
        if !left.is_empty() || !groups.is_empty() {
            return Err(InitError::SwitchUser(format!(
                "supplementary groups {left:?} (wanted {groups:?}) cannot be set in a user namespace with setgroups denied"
            )));
        }
    }
    let gid = Gid::from_raw(user.gid());
    setresgid(gid, gid, gid).map_err(|e| InitError::SwitchUser(format!("setresgid: {e}")))?;
    let uid = Uid::from_raw(user.uid());
    setresuid(uid, uid, uid).map_err(|e| InitError::SwitchUser(format!("setresuid: {e}")))
}

/// Clears whatever is left and verifies that every set is empty.
pub fn verify_no_caps() -> Result<(), InitError> {
    for set in [CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(|e| InitError::DropCaps(format!("{set:?}: {e}")))?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Bounding,
        CapSet::Effective,
        CapSet::Inheritable,
        CapSet::Permitted,
    ] {
        let left = caps::read(None, set).map_err(|e| InitError::DropCaps(e.to_string()))?;
        if !left.is_empty() {
            return Err(InitError::DropCaps(format!("{set:?} still holds {left:?}")));
        }
    }
    Ok(())
}
