//! Keeps the host's egress table in place (#32 §1): a thread subscribed to
//! nf_tables' change events (`NFNLGRP_NFTABLES`) notices at once when a
//! transaction of someone else deletes, flushes or changes the daemon's
//! table (`nft delete table`, `nft flush ruleset`, a firewall reload, a
//! replacement) and rebuilds it, with every live sandbox's element, in one
//! transaction. Meanwhile the state is `rebuilding`: creates that need
//! egress wait for it, pool members are not handed out. The sandboxes
//! themselves stay closed all along: their own namespaces hold the deny
//! list too (`Policy::render_sandbox_side`).
//!
//! What is ours: a transaction whose generation message names the PID of
//! an `nft` the daemon ran (recorded before that `nft` reads its script),
//! and transactions that only add or remove set elements (the daemon's own
//! per-sandbox changes, which are made over netlink from many threads).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use tracing::{error, info, warn};

use super::nfnl::attr;

const NFNLGRP_NFTABLES: libc::c_int = 7;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_DELTABLE: u8 = 2;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_DELSETELEM: u8 = 14;
const NFT_MSG_NEWGEN: u8 = 15;
const NFTA_GEN_PROC_PID: u16 = 2;
const NFTA_GEN_PROC_NAME: u16 = 3;
const NFPROTO_INET: u8 = 1;
const NLMSG_ERROR: u16 = 2;

/// The state of the host's egress table (`/health`'s `egress`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Enforced,
    Rebuilding,
    Failed(String),
}

impl Health {
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Enforced => "enforced",
            Health::Rebuilding => "rebuilding",
            Health::Failed(_) => "failed",
        }
    }
}

/// Shared between the guard thread, creates and `/health`.
pub struct Guard {
    state: Mutex<Health>,
    changed: Condvar,
    /// Rebuilds after a loss (not the start-up build).
    pub rebuilds: AtomicU64,
    /// PIDs of the `nft` processes the daemon ran for its host table (the
    /// last few), so their transactions are not taken for someone else's.
    own: Mutex<VecDeque<u32>>,
}

impl Default for Guard {
    fn default() -> Self {
        Guard {
            state: Mutex::new(Health::Rebuilding),
            changed: Condvar::new(),
            rebuilds: AtomicU64::new(0),
            own: Mutex::new(VecDeque::new()),
        }
    }
}

impl Guard {
    pub fn health(&self) -> Health {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, h: Health) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = h;
        self.changed.notify_all();
    }

    /// Waits up to `timeout` for the table to be enforced; the state when
    /// it stopped waiting.
    pub fn wait_enforced(&self, timeout: Duration) -> Health {
        let end = Instant::now() + timeout;
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *g == Health::Enforced {
                return Health::Enforced;
            }
            let now = Instant::now();
            if now >= end {
                return g.clone();
            }
            g = self
                .changed
                .wait_timeout(g, end - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Records the PID of an `nft` the daemon runs on its host table.
    pub fn own_pid(&self, pid: u32) {
        let mut o = self.own.lock().unwrap_or_else(|p| p.into_inner());
        o.push_back(pid);
        while o.len() > 32 {
            o.pop_front();
        }
    }

    fn is_own(&self, pid: u32) -> bool {
        self.own
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&pid)
    }
}

/// A netlink socket subscribed to nf_tables' change events.
pub fn subscribe() -> std::io::Result<OwnedFd> {
    let fd: OwnedFd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
    let set = |level, opt, val: &[u8]| -> std::io::Result<()> {
        // SAFETY: `val` is a valid buffer of the given length for the
        // duration of the call; the fd is open.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                opt,
                val.as_ptr().cast(),
                val.len() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(
        libc::SOL_NETLINK,
        libc::NETLINK_ADD_MEMBERSHIP,
        &NFNLGRP_NFTABLES.to_ne_bytes(),
    )?;
    // A flush of a big ruleset sends many events at once.
    set(
        libc::SOL_SOCKET,
        libc::SO_RCVBUF,
        &(4 * 1024 * 1024 as libc::c_int).to_ne_bytes(),
    )?;
    // Wake up now and then, to retry a failed rebuild.
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: plain-old-data viewed as bytes for setsockopt.
    let tv_bytes = unsafe {
        std::slice::from_raw_parts(
            (&tv as *const libc::timeval).cast::<u8>(),
            std::mem::size_of::<libc::timeval>(),
        )
    };
    set(libc::SOL_SOCKET, libc::SO_RCVTIMEO, tv_bytes)?;
    Ok(fd)
}

/// What one transaction did to the table, so far.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touch {
    /// It changed the table (more than set elements).
    pub changed: bool,
    /// It deleted the table.
    pub deleted: bool,
    /// It created a table of that name.
    pub created: bool,
}

/// A finished transaction that changed the table and is not ours.
#[derive(Debug, PartialEq, Eq)]
pub struct Foreign {
    pub deleted: bool,
    pub created: bool,
    pub pid: u32,
    pub process: String,
}

/// Reads the events in `buf`, accumulating into `cur`; returns the
/// transactions that touched `table` and are not the daemon's own.
pub fn scan(
    buf: &[u8],
    table: &str,
    cur: &mut Touch,
    is_own: impl Fn(u32) -> bool,
) -> Vec<Foreign> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 20 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
        if len < 16 || off + len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
        let msg = &buf[off..off + len];
        off += len.next_multiple_of(4);
        if kind >> 8 != NFNL_SUBSYS_NFTABLES || msg.len() < 20 {
            continue;
        }
        let (what, family) = ((kind & 0xff) as u8, msg[16]);
        let attrs = &msg[20..];
        if what == NFT_MSG_NEWGEN {
            let pid = attr(attrs, NFTA_GEN_PROC_PID)
                .and_then(|a| a.try_into().ok())
                .map(u32::from_be_bytes)
                .unwrap_or(0);
            let t = std::mem::take(cur);
            if t.changed && !is_own(pid) {
                let process = attr(attrs, NFTA_GEN_PROC_NAME)
                    .map(|a| {
                        String::from_utf8_lossy(a)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                out.push(Foreign {
                    deleted: t.deleted,
                    created: t.created,
                    pid,
                    process,
                });
            }
            continue;
        }
        if family != NFPROTO_INET || what == NFT_MSG_NEWSETELEM || what == NFT_MSG_DELSETELEM {
            continue;
        }
        // Attribute 1 names the table in every nf_tables object message.
        if attr(attrs, 1).is_some_and(|n| n.strip_suffix(b"\0").unwrap_or(n) == table.as_bytes()) {
            cur.changed = true;
            cur.deleted |= what == NFT_MSG_DELTABLE;
            cur.created |= what == NFT_MSG_NEWTABLE;
        }
    }
    out
}

/// Runs the guard on a thread of its own: `rebuild` is called after every
/// foreign change of `table` (and again every second while it fails).
pub fn spawn(
    fd: OwnedFd,
    table: String,
    guard: Arc<Guard>,
    rebuild: impl Fn() -> Result<usize, String> + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("sandboxd-egress-guard".into())
        .spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            let mut cur = Touch::default();
            let mut failing = false;
            loop {
                let mut todo: Option<String> = None;
                match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                    Ok(n) => {
                        if has_error(&buf[..n]) {
                            continue;
                        }
                        for f in scan(&buf[..n], &table, &mut cur, |p| guard.is_own(p)) {
                            let what = match (f.deleted, f.created) {
                                (true, true) => "replaced",
                                (true, false) => "deleted",
                                _ => "changed",
                            };
                            warn!(
                                table = %format!("inet {table}"),
                                pid = f.pid,
                                process = %f.process,
                                "the egress table was {what} by another process; rebuilding it (sandboxes stay closed meanwhile: their own namespaces deny the same)"
                            );
                            todo = Some(what.to_string());
                        }
                    }
                    Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {
                        if failing {
                            todo = Some("still missing".into());
                        }
                    }
                    Err(nix::errno::Errno::ENOBUFS) => {
                        // Events were lost: the table may be gone.
                        warn!(table = %format!("inet {table}"), "nf_tables events were lost; rebuilding the egress table to be sure");
                        cur = Touch::default();
                        todo = Some("events lost".into());
                    }
                    Err(e) => {
                        error!(error = %e, "the egress guard cannot read nf_tables events; it stops (the sandboxes' own namespaces still deny)");
                        guard.set(Health::Failed(format!("event socket: {e}")));
                        return;
                    }
                }
                if todo.is_none() {
                    continue;
                }
                guard.set(Health::Rebuilding);
                sandbox_abi::failpoint::hit(sandbox_abi::failpoint::Point::NetBeforeRebuild);
                let t0 = Instant::now();
                match rebuild() {
                    Ok(n) => {
                        guard.rebuilds.fetch_add(1, Ordering::Relaxed);
                        guard.set(Health::Enforced);
                        failing = false;
                        info!(
                            table = %format!("inet {table}"),
                            sandboxes = n,
                            ms = t0.elapsed().as_millis() as u64,
                            "egress table rebuilt"
                        );
                    }
                    Err(e) => {
                        if !failing {
                            error!(table = %format!("inet {table}"), error = %e, "cannot rebuild the egress table; creates that need egress fail with 503 until it is back (retrying every second)");
                        }
                        failing = true;
                        guard.set(Health::Failed(e));
                    }
                }
            }
        })
        .map(drop)
}

/// An `NLMSG_ERROR` in the buffer (ignored: the socket only listens).
fn has_error(buf: &[u8]) -> bool {
    buf.len() >= 16 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(what: u8, family: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut a = Vec::new();
        for (k, p) in attrs {
            a.extend_from_slice(&((4 + p.len()) as u16).to_ne_bytes());
            a.extend_from_slice(&k.to_ne_bytes());
            a.extend_from_slice(p);
            a.resize(a.len().next_multiple_of(4), 0);
        }
        let mut m = Vec::new();
        m.extend_from_slice(&((20 + a.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | u16::from(what)).to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.push(family);
        m.extend_from_slice(&[0; 3]);
        m.extend_from_slice(&a);
        m
    }

    fn gen(pid: u32) -> Vec<u8> {
        msg(
            NFT_MSG_NEWGEN,
            0,
            &[
                (1, &7u32.to_be_bytes()),
                (NFTA_GEN_PROC_PID, &pid.to_be_bytes()),
                (NFTA_GEN_PROC_NAME, b"nft\0"),
            ],
        )
    }

    #[test]
    fn finds_foreign_changes_of_the_table_only() {
        let mut cur = Touch::default();
        // Someone deletes our table.
        let mut b = msg(NFT_MSG_DELTABLE, NFPROTO_INET, &[(1, b"sbx\0")]);
        b.extend(gen(42));
        let f = scan(&b, "sbx", &mut cur, |_| false);
        assert_eq!(
            f,
            vec![Foreign {
                deleted: true,
                created: false,
                pid: 42,
                process: "nft".into()
            }]
        );
        // Our own rebuild.
        let mut b = msg(NFT_MSG_DELTABLE, NFPROTO_INET, &[(1, b"sbx\0")]);
        b.extend(msg(0, NFPROTO_INET, &[(1, b"sbx\0")]));
        b.extend(gen(43));
        assert!(scan(&b, "sbx", &mut cur, |p| p == 43).is_empty());
        // Another table, another family, set elements: not a change.
        let mut b = msg(NFT_MSG_DELTABLE, NFPROTO_INET, &[(1, b"sbx2\0")]);
        b.extend(msg(NFT_MSG_DELTABLE, 2, &[(1, b"sbx\0")]));
        b.extend(msg(NFT_MSG_NEWSETELEM, NFPROTO_INET, &[(1, b"sbx\0")]));
        b.extend(gen(44));
        assert!(scan(&b, "sbx", &mut cur, |_| false).is_empty());
        // A rule added to it (split over two reads).
        let b = msg(6, NFPROTO_INET, &[(1, b"sbx\0"), (2, b"forward\0")]);
        assert!(scan(&b, "sbx", &mut cur, |_| false).is_empty());
        let f = scan(&gen(45), "sbx", &mut cur, |_| false);
        assert_eq!(f.len(), 1);
        assert!(!f[0].deleted);
    }
}
