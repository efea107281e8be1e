//! Sandbox networking (`[network]`, see `docs/network.md`). In `egress`
//! mode every sandbox gets a point-to-point veth pair (a /31 of the
//! subnet: the even address on the host end `<link_prefix><slot>`, the odd
//! one on the sandbox's `eth0`, default route via the host end), NAT and
//! the egress policy of the daemon's nftables table. In `none` mode (or for
//! a sandbox created with `"network": "none"`) a sandbox has only `lo`.
//!
//! Crash safety: nothing here needs `state.json` to be cleaned up. At
//! start-up the table is rebuilt from the adopted sandboxes (stale set
//! elements vanish) and every host link with our prefix that no adopted
//! sandbox holds is deleted (its peer and addresses go with it).

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::model::NetworkMode;

pub mod addr;
mod config;
pub mod ct;
pub mod dns;
pub mod guard;
pub mod link;
pub mod nfnl;
pub mod nft;
pub mod rtnl;

pub use config::NetworkConfig;

use addr::{Cidr, Hole, Pool, Slot};
use guard::{Guard, Health};
use link::{LinkError, Netlink, VethPlan};
use nft::{Nft, NftError, Policy};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("[network] {0}")]
    Config(String),
    #[error("[network] subnet {subnet} overlaps the host's route to {route}{}: choose another subnet", dev.as_ref().map(|d| format!(" (dev {d})")).unwrap_or_default())]
    Overlap {
        subnet: Cidr,
        route: Cidr,
        dev: Option<String>,
    },
    #[error("cannot enable IPv4 forwarding: {0}")]
    Forwarding(std::io::Error),
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Nfnl(#[from] nfnl::NfnlError),
    #[error("the address pool {0} is exhausted")]
    Exhausted(Cidr),
    #[error("network \"egress\" asked for, but this daemon's [network] mode is \"none\"")]
    EgressDisabled,
    /// The host's egress table is missing and not (yet) rebuilt: HTTP 503.
    #[error("the egress policy is not in force on this node ({0}); retry shortly")]
    Unavailable(String),
    /// The deny list inside the sandbox's own namespace.
    #[error("cannot load the egress policy into the sandbox's network namespace: {0}")]
    SandboxSide(NftError),
}

impl NetError {
    /// The request's fault (HTTP 400).
    pub fn is_user_error(&self) -> bool {
        matches!(self, NetError::EgressDisabled)
    }
}

/// A sandbox's network as recorded in `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    pub slot: Slot,
    /// The sandbox's address (`eth0`).
    pub address: Ipv4Addr,
    /// The host end's address (its default gateway).
    pub gateway: Ipv4Addr,
    /// The host end's name.
    pub link: String,
}

struct Egress {
    policy: Policy,
    /// The table loaded into every sandbox's own namespace (rendered once).
    sandbox_side: String,
    guard: Arc<Guard>,
    /// Held while the host table is rebuilt and while an element is added
    /// or removed, so that no element change falls between a rebuild's
    /// rendering and its load.
    table_lock: Arc<Mutex<()>>,
    nft: Nft,
    netlink: Netlink,
    /// A second netlink thread for the removals after deletes, so that a
    /// burst of them (about 20 ms of kernel time each) never queues in
    /// front of a create's veth.
    remover: Netlink,
    pool: Arc<Mutex<Pool>>,
}

/// The daemon's networking.
pub struct Network {
    mode: NetworkMode,
    egress: Option<Egress>,
}

/// The set of (host link, sandbox address) pairs of the table.
const SET: &str = "sandboxes";

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// How long a create that needs egress waits for a missing host table to be
/// rebuilt before it fails with 503.
const WAIT_ENFORCED: std::time::Duration = std::time::Duration::from_secs(3);

/// The `sandboxes` set's elements of the slots `pool` holds.
fn elements(pool: &Pool, prefix: &str) -> Vec<String> {
    pool.held()
        .map(|(_, s)| nft::element(&format!("{prefix}{}", s.0), pool.sandbox_addr(*s)))
        .collect()
}

fn lock(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Network {
    /// Loopback only for every sandbox.
    pub fn none() -> Network {
        Network {
            mode: NetworkMode::None,
            egress: None,
        }
    }

    /// Checks the configuration and the host (the subnet must not overlap
    /// a route the host has), enables IPv4 forwarding and picks the
    /// resolvers. The table is built by [`finish_startup`](Self::finish_startup).
    pub fn new(cfg: &NetworkConfig) -> Result<Network, NetError> {
        if cfg.mode == NetworkMode::None {
            info!("network mode none: sandboxes have loopback only");
            return Ok(Network::none());
        }
        let subnet: Cidr = cfg.subnet.parse().map_err(NetError::Config)?;
        if subnet.len > 30 {
            return Err(NetError::Config(format!(
                "subnet {subnet} is too small (a /31 per sandbox)"
            )));
        }
        let allow = cfg
            .allow
            .iter()
            .map(|a| {
                a.parse::<Hole>()
                    .map_err(|e| NetError::Config(format!("allow: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let deny = cfg
            .deny
            .iter()
            .map(|a| {
                a.parse::<Cidr>()
                    .map_err(|e| NetError::Config(format!("deny: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ok_name = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !ok_name(&cfg.table) || !ok_name(&cfg.link_prefix) || cfg.link_prefix.len() > 8 {
            return Err(NetError::Config(
                "table and link_prefix: letters, digits, - and _ only (link_prefix at most 8)"
                    .into(),
            ));
        }
        if cfg.max_connections == 0 {
            return Err(NetError::Config(
                "max_connections must be at least 1".into(),
            ));
        }
        let netlink = Netlink::start()?;
        let routes = netlink.routes()?;
        // The networks of the host's own interfaces and its addresses (the
        // routes without a gateway: connected, local, broadcast), except
        // the sandboxes' veths (their subnet is denied anyway).
        let mut host_nets: Vec<Cidr> = Vec::new();
        for r in &routes {
            let ours = r
                .oif
                .as_deref()
                .is_some_and(|d| d.starts_with(&cfg.link_prefix));
            if !r.via && r.dst.len > 0 && !ours && !host_nets.contains(&r.dst) {
                host_nets.push(r.dst);
            }
        }
        for r in routes {
            if r.dst.len == 0
                || r.oif
                    .as_deref()
                    .is_some_and(|d| d.starts_with(&cfg.link_prefix))
            {
                continue;
            }
            if r.dst.overlaps(&subnet) {
                return Err(NetError::Overlap {
                    subnet,
                    route: r.dst,
                    dev: r.oif,
                });
            }
        }
        let (resolvers, _) = dns::host_resolvers(&cfg.resolv_conf);
        if resolvers.is_empty() {
            warn!(
                resolv_conf = %cfg.resolv_conf.display(),
                "no usable DNS resolver on this host (none, or only loopback ones without an upstream list): sandboxes get none"
            );
        }
        std::fs::write(IP_FORWARD, "1\n").map_err(NetError::Forwarding)?;
        info!(%subnet, table = %cfg.table, ?resolvers, "network mode egress (net.ipv4.ip_forward enabled)");
        let policy = Policy {
            table: cfg.table.clone(),
            link_prefix: cfg.link_prefix.clone(),
            subnet,
            allow,
            deny,
            max_connections: cfg.max_connections,
            resolvers,
            host_nets,
        };
        let nets: Vec<String> = policy.host_nets.iter().map(|c| c.to_string()).collect();
        info!(host_networks = %nets.join(", "), "the host's networks and addresses are denied to sandboxes (unless in [network] allow)");
        Ok(Network {
            mode: NetworkMode::Egress,
            egress: Some(Egress {
                sandbox_side: policy.render_sandbox_side(),
                policy,
                guard: Arc::new(Guard::default()),
                table_lock: Arc::new(Mutex::new(())),
                nft: Nft::default(),
                netlink,
                remover: Netlink::start()?,
                pool: Arc::new(Mutex::new(Pool::new(subnet))),
            }),
        })
    }

    pub fn mode(&self) -> NetworkMode {
        self.mode
    }

    /// The mode of a sandbox that asked for `requested`.
    pub fn effective(&self, requested: Option<NetworkMode>) -> Result<NetworkMode, NetError> {
        match (requested, self.mode) {
            (Some(NetworkMode::Egress), NetworkMode::None) => Err(NetError::EgressDisabled),
            (Some(m), _) => Ok(m),
            (None, m) => Ok(m),
        }
    }

    fn pool(e: &Egress) -> std::sync::MutexGuard<'_, Pool> {
        e.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives sandbox `id` (whose network namespace is `netns`) its veth,
    /// address, route and set element.
    pub fn attach(&self, id: &str, netns: &OwnedFd) -> Result<Option<NetState>, NetError> {
        let Some(e) = &self.egress else {
            return Ok(None);
        };
        // The host's table must be in force (it is being rebuilt if a
        // firewall reload just removed it): wait a little, else 503.
        Self::enforced(e)?;
        // The deny list inside the sandbox's own namespace, before it has
        // a veth: its traffic stays closed even while the host's table is
        // missing.
        e.nft
            .run_in(&e.sandbox_side, std::os::fd::AsFd::as_fd(netns))
            .map_err(NetError::SandboxSide)?;
        let (slot, address, gateway) = {
            let mut pool = Self::pool(e);
            let slot = pool.take(id).ok_or(NetError::Exhausted(e.policy.subnet))?;
            (slot, pool.sandbox_addr(slot), pool.host_addr(slot))
        };
        let link = format!("{}{}", e.policy.link_prefix, slot.0);
        let made = e
            .netlink
            .create_veth(&VethPlan {
                host_if: &link,
                host_addr: gateway,
                sandbox_addr: address,
                netns,
            })
            .map_err(NetError::from)
            .and_then(|()| {
                let add = || {
                    let _l = lock(&e.table_lock);
                    nfnl::change_element(nfnl::Op::Add, &e.policy.table, SET, &link, address)
                };
                match add() {
                    // The table went away since: the rebuild renders this
                    // slot's element (it is held); add it again once the
                    // table is back, in case the rebuild came before.
                    Err(nfnl::NfnlError::Kernel(k)) if k.raw_os_error() == Some(libc::ENOENT) => {
                        Self::enforced(e)?;
                        add().map_err(NetError::from)
                    }
                    r => r.map_err(NetError::from),
                }
            });
        // On an error the caller's cleanup (detach) finds the slot and
        // removes whatever was made.
        made?;
        Ok(Some(NetState {
            slot,
            address,
            gateway,
            link,
        }))
    }

    /// Waits for the host's table to be in force (bounded).
    fn enforced(e: &Egress) -> Result<(), NetError> {
        match e.guard.wait_enforced(WAIT_ENFORCED) {
            Health::Enforced => Ok(()),
            Health::Rebuilding => Err(NetError::Unavailable(format!(
                "the table inet {} is being rebuilt after it was removed or changed",
                e.policy.table
            ))),
            Health::Failed(why) => Err(NetError::Unavailable(format!(
                "the table inet {} is missing and cannot be rebuilt: {why}",
                e.policy.table
            ))),
        }
    }

    /// Whether the host's egress table is in force (always, in mode none).
    pub fn egress_enforced(&self) -> bool {
        match &self.egress {
            Some(e) => e.guard.health() == Health::Enforced,
            None => true,
        }
    }

    /// The egress table's state (`/health`) and how many times it was
    /// rebuilt after a loss; None in mode none.
    pub fn egress_health(&self) -> Option<(Health, u64)> {
        let e = self.egress.as_ref()?;
        Some((
            e.guard.health(),
            e.guard.rebuilds.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    /// The slot `from` holds is now `to`'s (a claimed pool member).
    pub fn rename(&self, from: &str, to: &str) {
        let Some(e) = &self.egress else { return };
        let mut pool = Self::pool(e);
        if let Some(slot) = pool.release(from) {
            pool.claim(to, slot);
        }
    }

    /// A restarted daemon keeps the network of an adopted sandbox. False
    /// when the recorded slot does not fit this daemon's pool.
    pub fn adopt(&self, id: &str, st: &NetState) -> bool {
        let Some(e) = &self.egress else {
            return false;
        };
        let mut pool = Self::pool(e);
        pool.claim(id, st.slot)
            && pool.sandbox_addr(st.slot) == st.address
            && st.link == format!("{}{}", e.policy.link_prefix, st.slot.0)
    }

    /// Removes sandbox `id`'s set element and veth and frees its slot.
    /// Nothing to do when it has none. The removal runs in the background
    /// on a netlink thread of its own (deleting a veth costs the kernel about 20 ms
    /// of RCU grace periods): the slot is handed out again only once it is
    /// over, and a crash before then leaves the remains to the next
    /// start-up's rebuild and sweep. [`flush`](Self::flush) waits for it.
    pub fn detach(&self, id: &str) {
        let Some(e) = &self.egress else { return };
        let (slot, address) = {
            let mut pool = Self::pool(e);
            let Some(slot) = pool.retire(id) else {
                return;
            };
            (slot, pool.sandbox_addr(slot))
        };
        let link = format!("{}{}", e.policy.link_prefix, slot.0);
        let (table, pool, id) = (e.policy.table.clone(), e.pool.clone(), id.to_string());
        let (l, a, tl) = (link.clone(), address, e.table_lock.clone());
        let id2 = id.clone();
        e.remover.delete_later(
            link,
            move || {
                let _l = lock(&tl);
                if let Err(err) = nfnl::change_element(nfnl::Op::Delete, &table, SET, &l, a) {
                    warn!(sandbox_id = %id, error = %err, "cannot remove the sandbox's set element");
                }
            },
            move |r| {
                if let Err(err) = r {
                    warn!(error = %err, "cannot delete a sandbox's veth");
                }
                // Its flows must not reach the next sandbox on the address
                // (the veth is gone: no new entry can be made for it).
                match ct::delete_address(address) {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(sandbox_id = %id2, entries = n, "deleted the sandbox's conntrack entries"),
                    Err(err) => {
                        // Keep the address out of the pool rather than
                        // hand it out with live flows.
                        warn!(sandbox_id = %id2, %address, error = %err, "cannot delete the sandbox's conntrack entries; its address is not reused until the daemon restarts");
                        return;
                    }
                }
                pool.lock().unwrap_or_else(|p| p.into_inner()).retired(slot);
            },
        );
    }

    /// Waits until the background removals of [`detach`](Self::detach)
    /// requested so far are over.
    pub fn flush(&self) {
        if let Some(e) = &self.egress {
            e.remover.flush();
        }
    }

    /// After reconciliation: (re)builds the table with the adopted
    /// sandboxes' elements, one transaction, and deletes every host link
    /// with our prefix no adopted sandbox holds.
    pub fn finish_startup(&self) -> Result<(), NetError> {
        let Some(e) = &self.egress else { return Ok(()) };
        let held: std::collections::HashSet<String> = Self::pool(e)
            .held()
            .map(|(_, s)| format!("{}{}", e.policy.link_prefix, s.0))
            .collect();
        // Subscribed to nf_tables' events before the table is built, so
        // that no removal after the build goes unseen.
        let events = guard::subscribe().map_err(|err| {
            NetError::Config(format!("cannot subscribe to nf_tables events: {err}"))
        })?;
        let rebuild = {
            let (policy, nft, pool, tl, g) = (
                e.policy.clone(),
                e.nft.clone(),
                e.pool.clone(),
                e.table_lock.clone(),
                e.guard.clone(),
            );
            move || -> Result<usize, String> {
                let _l = lock(&tl);
                let elements = elements(
                    &pool.lock().unwrap_or_else(|p| p.into_inner()),
                    &policy.link_prefix,
                );
                nft.run_recorded(&policy.render(&elements), |pid| g.own_pid(pid))
                    .map_err(|err| err.to_string())?;
                Ok(elements.len())
            }
        };
        rebuild().map_err(|err| NetError::Nft(NftError::Failed(err)))?;
        e.guard.set(Health::Enforced);
        guard::spawn(events, e.policy.table.clone(), e.guard.clone(), rebuild)
            .map_err(|err| NetError::Config(format!("cannot start the egress guard: {err}")))?;
        let mut removed = Vec::new();
        for l in e.netlink.links_with_prefix(&e.policy.link_prefix)? {
            if !held.contains(&l) {
                e.netlink.delete(&l)?;
                removed.push(l);
            }
        }
        if !removed.is_empty() {
            info!(?removed, "removed stale sandbox veths");
        }
        Ok(())
    }

    /// The drop counters by reason (metrics): the table's named counters,
    /// read over netlink (no process per scrape). None while the table is
    /// missing (the guard is rebuilding it, say): a debug line, no more.
    pub fn drop_counters(&self) -> Vec<(String, u64)> {
        let Some(e) = &self.egress else {
            return Vec::new();
        };
        let table = &e.policy.table;
        match nfnl::counters(table) {
            Ok(c) if c.is_empty() => {
                debug!(table = %format!("inet {table}"), "no drop counters: the egress table is missing (being rebuilt?)");
                Vec::new()
            }
            Ok(c) => c.into_iter().map(|c| (c.name, c.packets)).collect(),
            Err(err) => {
                debug!(table = %format!("inet {table}"), error = %err, "cannot read the drop counters");
                Vec::new()
            }
        }
    }

    /// Bytes (sent by, received by) sandbox `id`, from its host end's
    /// counters (what the host end receives, the sandbox sent).
    pub fn bytes(&self, link: &str) -> Option<(u64, u64)> {
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/sys/class/net/{link}/statistics/{f}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some((read("rx_bytes")?, read("tx_bytes")?))
    }
}
