//! IPv4 prefixes, the operator's allow/deny entries, and the address pool
//! (one /31 per sandbox: the even address on the host end, the odd one on
//! the sandbox's `eth0`).

use std::collections::HashMap;
use std::net::Ipv4Addr;

/// An IPv4 prefix (host bits cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, len: u8) -> Cidr {
        let mask = Self::mask(len);
        Cidr {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            len,
        }
    }

    fn mask(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.len) == u32::from(self.addr)
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// Number of addresses.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.len))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    /// `a.b.c.d/len` or a bare address (a /32).
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (a, l) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = a
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 address or prefix"))?;
        let len: u8 = l
            .trim()
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("{s:?}: bad prefix length"))?;
        Ok(Cidr::new(addr, len))
    }
}

/// An `allow` entry: a prefix, optionally one port (TCP and UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    pub cidr: Cidr,
    pub port: Option<u16>,
}

impl std::str::FromStr for Hole {
    type Err = String;

    /// `CIDR` or `CIDR:port`.
    fn from_str(s: &str) -> Result<Hole, String> {
        let (c, port) = match s.rsplit_once(':') {
            Some((c, p)) => {
                let port: u16 = p
                    .trim()
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{s:?}: bad port"))?;
                (c, Some(port))
            }
            None => (s, None),
        };
        Ok(Hole {
            cidr: c.parse()?,
            port,
        })
    }
}

/// One sandbox's share of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Slot(pub u32);

/// The per-sandbox /31s of the subnet, and who holds which.
#[derive(Debug)]
pub struct Pool {
    subnet: Cidr,
    held: HashMap<String, Slot>,
    /// Slots of deleted sandboxes whose veth, set element and conntrack
    /// entries are still being removed (in the background): not handed out
    /// until then.
    retiring: std::collections::HashSet<u32>,
    /// The free slots, least recently used first: a deleted sandbox's
    /// address comes back as late as possible (never-used slots first, in
    /// order), so whatever still addresses it (a peer's retries, a flow the
    /// conntrack flush could not see) finds no one for as long as the pool
    /// allows. Slots held or retiring may be in it (claimed at adoption):
    /// they are skipped when met.
    free: std::collections::VecDeque<u32>,
}

impl Pool {
    pub fn new(subnet: Cidr) -> Pool {
        let mut p = Pool {
            subnet,
            held: HashMap::new(),
            retiring: Default::default(),
            free: Default::default(),
        };
        p.free = (0..p.slots()).collect();
        p
    }

    pub fn slots(&self) -> u32 {
        (self.subnet.size() / 2).min(u64::from(u32::MAX)) as u32
    }

    /// The host end's address of `slot`.
    pub fn host_addr(&self, slot: Slot) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.addr) + 2 * slot.0)
    }

    /// The sandbox's address of `slot`.
    pub fn sandbox_addr(&self, slot: Slot) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.addr) + 2 * slot.0 + 1)
    }

    /// The least recently used free slot, now held by `id`.
    pub fn take(&mut self, id: &str) -> Option<Slot> {
        let used: std::collections::HashSet<u32> = self.held.values().map(|s| s.0).collect();
        let slot = loop {
            let n = self.free.pop_front()?;
            if !used.contains(&n) && !self.retiring.contains(&n) {
                break Slot(n);
            }
        };
        self.held.insert(id.to_string(), slot);
        Some(slot)
    }

    /// Marks `slot` held by `id` (adoption). False when it is not in the
    /// pool or someone else holds it.
    pub fn claim(&mut self, id: &str, slot: Slot) -> bool {
        if slot.0 >= self.slots()
            || self.retiring.contains(&slot.0)
            || self.held.values().any(|s| *s == slot)
        {
            return false;
        }
        self.held.insert(id.to_string(), slot);
        true
    }

    /// `id` lets go of its slot without it becoming free (it changes
    /// hands: see `Network::rename`).
    pub fn release(&mut self, id: &str) -> Option<Slot> {
        self.held.remove(id)
    }

    /// `id` lets go of its slot, which stays out of use until
    /// [`retired`](Self::retired).
    pub fn retire(&mut self, id: &str) -> Option<Slot> {
        let slot = self.held.remove(id)?;
        self.retiring.insert(slot.0);
        Some(slot)
    }

    /// The cleanup of a retiring slot is over: it may be handed out again.
    pub fn retired(&mut self, slot: Slot) {
        if self.retiring.remove(&slot.0) {
            self.free.push_back(slot.0);
        }
    }

    pub fn get(&self, id: &str) -> Option<Slot> {
        self.held.get(id).copied()
    }

    pub fn held(&self) -> impl Iterator<Item = (&String, &Slot)> {
        self.held.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalizes() {
        let c: Cidr = "10.243.7.9/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.243.0.0/16");
        assert!(c.contains("10.243.255.1".parse().unwrap()));
        assert!(!c.contains("10.244.0.1".parse().unwrap()));
        assert_eq!("10.1.2.3".parse::<Cidr>().unwrap().len, 32);
        assert!("10.1.2.3/33".parse::<Cidr>().is_err());
        let h: Hole = "10.1.2.3/32:3306".parse().unwrap();
        assert_eq!(h.port, Some(3306));
        let h: Hole = "10.9.0.0/16".parse().unwrap();
        assert_eq!(h.port, None);
        assert!("10.9.0.0/16:0".parse::<Hole>().is_err());
        assert!("10.0.0.0/8"
            .parse::<Cidr>()
            .unwrap()
            .overlaps(&"10.243.0.0/16".parse().unwrap()));
    }

    #[test]
    fn pool_hands_out_and_takes_back() {
        let mut p = Pool::new("10.243.0.0/30".parse().unwrap());
        assert_eq!(p.slots(), 2);
        let a = p.take("a").unwrap();
        let b = p.take("b").unwrap();
        assert!(p.take("c").is_none());
        assert_eq!(p.host_addr(a), "10.243.0.0".parse::<Ipv4Addr>().unwrap());
        assert_eq!(p.sandbox_addr(b), "10.243.0.3".parse::<Ipv4Addr>().unwrap());
        p.release("a");
        assert!(p.claim("c", a));
        assert!(!p.claim("d", b));
        // A retiring slot is handed out only once its cleanup is over.
        assert_eq!(p.retire("b"), Some(b));
        assert!(p.take("d").is_none());
        assert!(!p.claim("d", b));
        p.retired(b);
        assert_eq!(p.take("d"), Some(b));
    }

    #[test]
    fn pool_hands_out_the_least_recently_used_slot() {
        let mut p = Pool::new("10.243.0.0/29".parse().unwrap());
        let a = p.take("a").unwrap();
        let b = p.take("b").unwrap();
        assert_eq!((a, b), (Slot(0), Slot(1)));
        // a's slot is free again, but slots never used come first, then
        // the ones freed longest ago.
        p.retire("a");
        p.retired(a);
        assert_eq!(p.take("c"), Some(Slot(2)));
        p.retire("b");
        p.retired(b);
        assert_eq!(p.take("d"), Some(Slot(3)));
        assert_eq!(p.take("e"), Some(a));
        assert_eq!(p.take("f"), Some(b));
        assert!(p.take("g").is_none());
        // A slot claimed at adoption is skipped when met in the free list.
        let mut p = Pool::new("10.243.0.0/30".parse().unwrap());
        assert!(p.claim("x", Slot(0)));
        assert_eq!(p.take("y"), Some(Slot(1)));
        assert!(p.take("z").is_none());
    }
}
