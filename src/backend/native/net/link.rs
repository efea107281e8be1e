//! Netlink work (rtnetlink) on one dedicated thread with its own
//! single-threaded tokio runtime: veth pairs in the host's namespace, and
//! the sandbox side configured through a netlink socket opened inside the
//! sandbox's namespace (the thread `setns`es there to open it and comes
//! straight back, as the netns connector does). No tokio worker thread of
//! the daemon ever changes namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;

use futures_util::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkInfo};
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use nix::sched::{setns, CloneFlags};
use rtnetlink::{Handle, IpVersion};

use super::addr::Cidr;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
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
    rt: tokio::runtime::Runtime,
    home: OwnedFd,
    host: Handle,
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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(LinkError::Socket)?;
        let host = {
            let _g = rt.enter();
            let (conn, handle, _) = rtnetlink::new_connection().map_err(LinkError::Socket)?;
            rt.spawn(conn);
            handle
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let mut ctx = Ctx { rt, home, host };
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

    /// The host's links whose name starts with `prefix`.
    pub fn links_with_prefix(&self, prefix: &str) -> Result<Vec<String>, LinkError> {
        let prefix = prefix.to_string();
        self.call(move |ctx| {
            let h = ctx.host.clone();
            ctx.rt.block_on(async move {
                let mut out = Vec::new();
                let mut s = h.link().get().execute();
                while let Some(m) = s.try_next().await? {
                    for a in m.attributes {
                        if let LinkAttribute::IfName(n) = a {
                            if n.starts_with(&prefix) {
                                out.push(n);
                            }
                        }
                    }
                }
                Ok(out)
            })
        })
    }

    /// Every IPv4 route of the host (all tables) with its device's name.
    pub fn routes(&self) -> Result<Vec<HostRoute>, LinkError> {
        self.call(move |ctx| {
            let h = ctx.host.clone();
            ctx.rt.block_on(async move {
                let mut names = std::collections::HashMap::new();
                let mut s = h.link().get().execute();
                while let Some(m) = s.try_next().await? {
                    for a in &m.attributes {
                        if let LinkAttribute::IfName(n) = a {
                            names.insert(m.header.index, n.clone());
                        }
                    }
                }
                let mut out = Vec::new();
                let mut s = h.route().get(IpVersion::V4).execute();
                while let Some(m) = s.try_next().await? {
                    let len = m.header.destination_prefix_length;
                    let mut dst = Ipv4Addr::UNSPECIFIED;
                    let mut oif = None;
                    let mut via = false;
                    for a in &m.attributes {
                        match a {
                            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = *a,
                            RouteAttribute::Oif(i) => oif = names.get(i).cloned(),
                            RouteAttribute::Gateway(_)
                            | RouteAttribute::MultiPath(_)
                            | RouteAttribute::Via(_) => via = true,
                            _ => {}
                        }
                    }
                    out.push(HostRoute {
                        dst: Cidr::new(dst, len),
                        oif,
                        via,
                    });
                }
                Ok(out)
            })
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
            let h = ctx.host.clone();
            // Host side.
            ctx.rt.block_on(async {
                let add = || {
                    // `veth(peer, name)`: the request's own link is `name`.
                    let mut req = h.link().add().veth(SANDBOX_IF.into(), host_if.clone());
                    for a in &mut req.message_mut().attributes {
                        if let LinkAttribute::LinkInfo(infos) = a {
                            for i in infos {
                                if let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))) = i {
                                    p.attributes.push(LinkAttribute::NetNsFd(netns.as_raw_fd()));
                                }
                            }
                        }
                    }
                    req.execute()
                };
                match add().await {
                    Err(e) if is_exists(&e) => {
                        if let Some(i) = if_index(&host_if) {
                            h.link().del(i).execute().await?;
                        }
                        add().await?;
                    }
                    r => r?,
                }
                let host =
                    if_index(&host_if).ok_or_else(|| LinkError::NotFound(host_if.clone()))?;
                add_p2p_addr(&h, host, host_addr).await?;
                Ok::<_, LinkError>(())
            })?;
            // Sandbox side, over a netlink socket opened in its namespace.
            let inner = {
                let _g = ctx.rt.enter();
                setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(LinkError::Enter)?;
                let made = rtnetlink::new_connection();
                let eth0 = if_index(SANDBOX_IF);
                if let Err(e) = setns(ctx.home.as_fd(), CloneFlags::CLONE_NEWNET) {
                    // Stuck in a sandbox namespace: this thread must not
                    // serve anything else.
                    tracing::error!(error = %e, "netlink thread cannot return to its namespace; aborting");
                    std::process::abort();
                }
                (made.map_err(LinkError::Socket)?, eth0)
            };
            let ((conn, sh, _), eth0) = inner;
            let task = ctx.rt.spawn(conn);
            let r = ctx.rt.block_on(async {
                let i = eth0.ok_or_else(|| LinkError::NotFound(SANDBOX_IF.into()))?;
                add_p2p_addr(&sh, i, sandbox_addr).await?;
                sh.link().set(i).up().execute().await?;
                sh.route()
                    .add()
                    .v4()
                    .gateway(host_addr)
                    .output_interface(i)
                    .execute()
                    .await?;
                Ok::<_, LinkError>(())
            });
            drop(sh);
            task.abort();
            r
        })
    }
}

/// Deletes the host link `name` (on the netlink thread).
fn delete_in(ctx: &mut Ctx, name: &str) -> Result<(), LinkError> {
    let h = ctx.host.clone();
    ctx.rt.block_on(async move {
        match if_index(name) {
            Some(i) => match h.clone().link().del(i).execute().await {
                Ok(()) => Ok(()),
                Err(e) if is_no_device(&e) => Ok(()),
                Err(e) => Err(e.into()),
            },
            None => Ok(()),
        }
    })
}

/// The sandbox end's name.
const SANDBOX_IF: &str = "eth0";

/// Adds `addr/31` to link `index` without a broadcast address (rtnetlink
/// adds the prefix's last address as one, which on a /31 is the peer: the
/// kernel would then treat the peer's address as broadcast and never route
/// to it).
async fn add_p2p_addr(h: &Handle, index: u32, addr: Ipv4Addr) -> Result<(), LinkError> {
    let mut req = h.address().add(index, IpAddr::V4(addr), 31);
    req.message_mut()
        .attributes
        .retain(|a| !matches!(a, AddressAttribute::Broadcast(_)));
    req.execute().await?;
    Ok(())
}

/// The index of link `name` in the calling thread's network namespace
/// (`if_nametoindex`, an ioctl: no link dump to parse, whose IPv6 attributes
/// this kernel makes netlink-packet-route warn about on every parse).
fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
    // if_nametoindex only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

fn is_exists(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.code.is_some_and(|c| c.get() == -libc::EEXIST))
}

fn is_no_device(e: &rtnetlink::Error) -> bool {
    match e {
        rtnetlink::Error::NetlinkError(m) => {
            m.code.map(|c| c.get() == -libc::ENODEV).unwrap_or(false)
        }
        _ => false,
    }
}
