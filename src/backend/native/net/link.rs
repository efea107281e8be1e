//! Route netlink work ([`rtnl`]) on one dedicated thread, one job after
//! another: veth pairs in the host's namespace, and the sandbox side
//! configured through a netlink socket opened inside the sandbox's
//! namespace (the thread `setns`es there to open it and comes straight
//! back, as the netns connector does). No tokio worker thread of the daemon
//! ever changes namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;

use nix::sched::{setns, CloneFlags};

use super::addr::Cidr;
use super::rtnl;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("netlink: {op}: {source}")]
    Netlink {
        op: &'static str,
        source: std::io::Error,
    },
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("cannot enter the sandbox's network namespace: {0}")]
    Enter(nix::Error),
    #[error("cannot return to the daemon's network namespace: {0}")]
    Return(nix::Error),
    #[error("link {0} not found")]
    NotFound(String),
    #[error("the netlink thread is gone")]
    Gone,
}

/// A route of the host (for the subnet overlap check).
#[derive(Debug, Clone)]
pub struct HostRoute {
    pub dst: Cidr,
    pub oif: Option<String>,
    /// Through a gateway (not a network of the host's own interfaces).
    pub via: bool,
}

/// What the sandbox side of one veth gets.
pub struct VethPlan<'a> {
    pub host_if: &'a str,
    pub host_addr: Ipv4Addr,
    pub sandbox_addr: Ipv4Addr,
    pub netns: &'a OwnedFd,
}

struct Ctx {
    home: OwnedFd,
    /// A route netlink socket of the host's namespace.
    host: OwnedFd,
    /// The sequence number of the last request.
    seq: u32,
}

impl Ctx {
    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }
}

/// Sends request `msg` (sequence `seq`) on `fd`; `op` names it in the error.
fn request(fd: &OwnedFd, op: &'static str, msg: &[u8], seq: u32) -> Result<(), LinkError> {
    rtnl::request(fd, msg, seq).map_err(|source| LinkError::Netlink { op, source })
}

type Job = Box<dyn FnOnce(&mut Ctx) + Send>;

/// Handle on the netlink thread.
#[derive(Clone)]
pub struct Netlink {
    tx: mpsc::Sender<Job>,
}

impl Netlink {
    pub fn start() -> Result<Netlink, LinkError> {
        let home: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(LinkError::Socket)?
            .into();
        let host = rtnl::open().map_err(LinkError::Socket)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let mut ctx = Ctx { home, host, seq: 0 };
        std::thread::Builder::new()
            .name("sandboxd-netlink".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(&mut ctx);
                }
            })
            .map_err(LinkError::Socket)?;
        Ok(Netlink { tx })
    }

    /// Runs `f` on the netlink thread and waits for its result.
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Ctx) -> Result<T, LinkError> + Send + 'static,
    ) -> Result<T, LinkError> {
        let (reply, rx) = mpsc::channel();
        self.tx
            .send(Box::new(move |ctx| {
                let _ = reply.send(f(ctx));
            }))
            .map_err(|_| LinkError::Gone)?;
        rx.recv().map_err(|_| LinkError::Gone)?
    }

    /// Every link of the host: (index, name).
    fn links(ctx: &mut Ctx) -> Result<Vec<(u32, String)>, LinkError> {
        let seq = ctx.next_seq();
        let mut out = Vec::new();
        rtnl::dump(&ctx.host, &rtnl::dump_links(seq), |m| {
            out.extend(rtnl::parse_link(m));
        })
        .map_err(|source| LinkError::Netlink {
            op: "link dump",
            source,
        })?;
        Ok(out)
    }

    /// The host's links whose name starts with `prefix`.
    pub fn links_with_prefix(&self, prefix: &str) -> Result<Vec<String>, LinkError> {
        let prefix = prefix.to_string();
        self.call(move |ctx| {
            Ok(Self::links(ctx)?
                .into_iter()
                .map(|(_, n)| n)
                .filter(|n| n.starts_with(&prefix))
                .collect())
        })
    }

    /// Every IPv4 route of the host (all tables) with its device's name.
    pub fn routes(&self) -> Result<Vec<HostRoute>, LinkError> {
        self.call(move |ctx| {
            let names: std::collections::HashMap<u32, String> =
                Self::links(ctx)?.into_iter().collect();
            let seq = ctx.next_seq();
            let mut out = Vec::new();
            rtnl::dump(&ctx.host, &rtnl::dump_routes(seq), |m| {
                if let Some(r) = rtnl::parse_route(m) {
                    out.push(HostRoute {
                        dst: Cidr::new(r.dst, r.len),
                        oif: r.oif.and_then(|i| names.get(&i).cloned()),
                        via: r.via,
                    });
                }
            })
            .map_err(|source| LinkError::Netlink {
                op: "route dump",
                source,
            })?;
            Ok(out)
        })
    }

    /// Deletes the host link `name`; Ok when it does not exist.
    pub fn delete(&self, name: &str) -> Result<(), LinkError> {
        let name = name.to_string();
        self.call(move |ctx| delete_in(ctx, &name))
    }

    /// On the netlink thread, without waiting for it (jobs run one after
    /// another, in order): runs `before`, deletes the host link `name`
    /// (see [`delete`](Self::delete)), then hands the result to `after`.
    pub fn delete_later(
        &self,
        name: String,
        before: impl FnOnce() + Send + 'static,
        after: impl FnOnce(Result<(), LinkError>) + Send + 'static,
    ) {
        let job = Box::new(move |ctx: &mut Ctx| {
            before();
            after(delete_in(ctx, &name));
        });
        if self.tx.send(job).is_err() {
            tracing::warn!("the netlink thread is gone; a veth cleanup is left to the next start");
        }
    }

    /// Waits until every job submitted so far has run.
    pub fn flush(&self) {
        let _ = self.call(|_| Ok(()));
    }

    /// Makes the veth pair of `plan` in one request: the host end named
    /// `host_if` (up), its peer created directly inside the sandbox's
    /// namespace as `eth0` (no move between namespaces: that costs the
    /// kernel an unregister and a register, about 20 ms here). Then the
    /// host end gets `host_addr/31`; the sandbox end `sandbox_addr/31`, up,
    /// and the default route via the host end. A leftover host link of the
    /// same name (a crash before the start-up sweep) is deleted and the
    /// pair made again. On an error the caller deletes `host_if` (which
    /// takes the peer with it).
    pub fn create_veth(&self, plan: &VethPlan<'_>) -> Result<(), LinkError> {
        let host_if = plan.host_if.to_string();
        let (host_addr, sandbox_addr) = (plan.host_addr, plan.sandbox_addr);
        let netns = plan.netns.try_clone().map_err(LinkError::Socket)?;
        self.call(move |ctx| {
            // Host side.
            let seq = ctx.next_seq();
            let add = rtnl::new_veth(&host_if, SANDBOX_IF, netns.as_raw_fd(), seq);
            match rtnl::request(&ctx.host, &add, seq) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    if let Some(i) = if_index(&host_if) {
                        let seq = ctx.next_seq();
                        request(&ctx.host, "link delete", &rtnl::del_link(i, seq), seq)?;
                    }
                    let seq = ctx.next_seq();
                    let add = rtnl::new_veth(&host_if, SANDBOX_IF, netns.as_raw_fd(), seq);
                    request(&ctx.host, "veth add", &add, seq)?;
                }
                r => r.map_err(|source| LinkError::Netlink {
                    op: "veth add",
                    source,
                })?,
            }
            let host = if_index(&host_if).ok_or_else(|| LinkError::NotFound(host_if.clone()))?;
            let seq = ctx.next_seq();
            let addr = rtnl::new_p2p_addr(host, host_addr, seq);
            request(&ctx.host, "address add", &addr, seq)?;
            // Sandbox side, over a netlink socket opened in its namespace.
            setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(LinkError::Enter)?;
            let made = rtnl::open();
            let eth0 = if_index(SANDBOX_IF);
            if let Err(e) = setns(ctx.home.as_fd(), CloneFlags::CLONE_NEWNET) {
                // Stuck in a sandbox namespace: this thread must not serve
                // anything else.
                tracing::error!(error = %e, "netlink thread cannot return to its namespace; aborting");
                std::process::abort();
            }
            let sandbox = made.map_err(LinkError::Socket)?;
            let i = eth0.ok_or_else(|| LinkError::NotFound(SANDBOX_IF.into()))?;
            let seq = ctx.next_seq();
            let addr = rtnl::new_p2p_addr(i, sandbox_addr, seq);
            request(&sandbox, "address add", &addr, seq)?;
            let seq = ctx.next_seq();
            request(&sandbox, "link up", &rtnl::set_up(i, seq), seq)?;
            let seq = ctx.next_seq();
            let route = rtnl::new_default_route(host_addr, i, seq);
            request(&sandbox, "route add", &route, seq)
        })
    }
}

/// Deletes the host link `name` (on the netlink thread).
fn delete_in(ctx: &mut Ctx, name: &str) -> Result<(), LinkError> {
    let Some(i) = if_index(name) else {
        return Ok(());
    };
    let seq = ctx.next_seq();
    match rtnl::request(&ctx.host, &rtnl::del_link(i, seq), seq) {
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
        r => r.map_err(|source| LinkError::Netlink {
            op: "link delete",
            source,
        }),
    }
}

/// The sandbox end's name.
const SANDBOX_IF: &str = "eth0";

/// The index of link `name` in the calling thread's network namespace
/// (`if_nametoindex`, an ioctl: no link dump to parse).
fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
    // if_nametoindex only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}
