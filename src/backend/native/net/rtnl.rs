//! Route netlink (`NETLINK_ROUTE`) messages the daemon sends, built and
//! read by hand with the attribute helpers of [`nfnl`](super::nfnl), as
//! `ip` sends them: a veth pair whose peer is made inside a sandbox's
//! network namespace, a /31 address, a link set up, a default route, a link
//! deleted, and the link and IPv4 route dumps of the start-up checks. Six
//! requests and two dumps did not need rtnetlink and its netlink-packet-*
//! stack (which also pinned a second `nix`). The socket calls are
//! synchronous: [`link`](super::link) runs them on its own thread.

use std::net::Ipv4Addr;
use std::os::fd::{OwnedFd, RawFd};

use nix::sys::socket::SockProtocol;

use super::nfnl::{
    ack_of, attr, attrs, dump_messages, open_protocol, push_attr, push_header, push_nested,
    receive, send, NfnlError, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;

const AF_UNSPEC: u8 = libc::AF_UNSPEC as u8;
const AF_INET: u8 = libc::AF_INET as u8;
const IFF_UP: u32 = libc::IFF_UP as u32;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

const RT_TABLE_MAIN: u8 = 254;
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_MULTIPATH: u16 = 9;
const RTA_VIA: u16 = 18;

/// Header (16 bytes) of a netlink message; its family header and
/// attributes follow.
const NLMSG_HDRLEN: usize = 16;
/// `struct ifinfomsg`, `struct ifaddrmsg`, `struct rtmsg`.
const IFINFOMSG_LEN: usize = 16;
const RTMSG_LEN: usize = 12;

/// One netlink message: header, family header `fixed`, attributes.
fn message(kind: u16, flags: u16, seq: u32, fixed: &[u8], attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + fixed.len() + attrs.len();
    let mut b = Vec::with_capacity(len);
    push_header(&mut b, len, kind, flags, seq);
    b.extend_from_slice(fixed);
    b.extend_from_slice(attrs);
    b
}

/// `struct ifinfomsg` of link `index` with `flags` set among `change`.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut h = [0u8; IFINFOMSG_LEN];
    h[0] = AF_UNSPEC;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// A string attribute's payload: NUL-terminated, as `ip` sends names.
fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// `ip link add <name> up type veth peer name <peer> netns <fd>`: the pair
/// in one request, the peer created directly in the namespace of `netns`.
pub fn new_veth(name: &str, peer: &str, netns: RawFd, seq: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(96);
    push_attr(&mut a, IFLA_IFNAME, &cstr(name));
    push_nested(&mut a, IFLA_LINKINFO, |b| {
        push_attr(b, IFLA_INFO_KIND, b"veth");
        push_nested(b, IFLA_INFO_DATA, |b| {
            let mut p = ifinfomsg(0, 0, 0).to_vec();
            push_attr(&mut p, IFLA_IFNAME, &cstr(peer));
            push_attr(&mut p, IFLA_NET_NS_FD, &(netns as u32).to_ne_bytes());
            push_attr(b, VETH_INFO_PEER, &p);
        });
    });
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
    message(RTM_NEWLINK, flags, seq, &ifinfomsg(0, IFF_UP, IFF_UP), &a)
}

/// `ip link del` of link `index`.
pub fn del_link(index: u32, seq: u32) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    message(RTM_DELLINK, flags, seq, &ifinfomsg(index, 0, 0), &[])
}

/// `ip link set <index> up`.
pub fn set_up(index: u32, seq: u32) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    message(
        RTM_SETLINK,
        flags,
        seq,
        &ifinfomsg(index, IFF_UP, IFF_UP),
        &[],
    )
}

/// `ip addr add <addr>/31 dev <index>`: address and local address, no
/// broadcast address (on a /31 the prefix's last address is the peer: the
/// kernel would then treat the peer's address as broadcast and never route
/// to it).
pub fn new_p2p_addr(index: u32, addr: Ipv4Addr, seq: u32) -> Vec<u8> {
    let mut h = [0u8; 8];
    h[0] = AF_INET;
    h[1] = 31;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    let mut a = Vec::with_capacity(16);
    push_attr(&mut a, IFA_ADDRESS, &addr.octets());
    push_attr(&mut a, IFA_LOCAL, &addr.octets());
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
    message(RTM_NEWADDR, flags, seq, &h, &a)
}

/// `ip route add default via <gateway> dev <index>` (main table, static).
pub fn new_default_route(gateway: Ipv4Addr, index: u32, seq: u32) -> Vec<u8> {
    let h = [
        AF_INET,
        0,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_STATIC,
        RT_SCOPE_UNIVERSE,
        RTN_UNICAST,
        0,
        0,
        0,
        0,
    ];
    let mut a = Vec::with_capacity(16);
    push_attr(&mut a, RTA_GATEWAY, &gateway.octets());
    push_attr(&mut a, RTA_OIF, &index.to_ne_bytes());
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;
    message(RTM_NEWROUTE, flags, seq, &h, &a)
}

/// The dump request of every link.
pub fn dump_links(seq: u32) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_DUMP;
    message(RTM_GETLINK, flags, seq, &ifinfomsg(0, 0, 0), &[])
}

/// The dump request of every IPv4 route (all tables).
pub fn dump_routes(seq: u32) -> Vec<u8> {
    let mut h = [0u8; RTMSG_LEN];
    h[0] = AF_INET;
    message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, &h, &[])
}

/// A link of a dump: its index and name.
pub fn parse_link(kind: u16, m: &[u8]) -> Option<(u32, String)> {
    if kind != RTM_NEWLINK || m.len() < NLMSG_HDRLEN + IFINFOMSG_LEN {
        return None;
    }
    let index = u32::from_ne_bytes(m[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].try_into().ok()?);
    let name = attr(&m[NLMSG_HDRLEN + IFINFOMSG_LEN..], IFLA_IFNAME)?;
    let name = name.strip_suffix(b"\0").unwrap_or(name);
    Some((index, String::from_utf8_lossy(name).into_owned()))
}

/// An IPv4 route of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: Ipv4Addr,
    pub len: u8,
    pub oif: Option<u32>,
    /// Through a gateway (or several, or another family's).
    pub via: bool,
}

/// An IPv4 route of a dump (other families are skipped).
pub fn parse_route(kind: u16, m: &[u8]) -> Option<Route> {
    if kind != RTM_NEWROUTE || m.len() < NLMSG_HDRLEN + RTMSG_LEN || m[NLMSG_HDRLEN] != AF_INET {
        return None;
    }
    let mut r = Route {
        dst: Ipv4Addr::UNSPECIFIED,
        len: m[NLMSG_HDRLEN + 1],
        oif: None,
        via: false,
    };
    for (k, p) in attrs(&m[NLMSG_HDRLEN + RTMSG_LEN..]) {
        match k {
            RTA_DST => {
                if let Ok(o) = <[u8; 4]>::try_from(p) {
                    r.dst = Ipv4Addr::from(o);
                }
            }
            RTA_OIF => r.oif = p.try_into().ok().map(u32::from_ne_bytes),
            RTA_GATEWAY | RTA_MULTIPATH | RTA_VIA => r.via = true,
            _ => {}
        }
    }
    Some(r)
}

/// A route netlink socket of the calling thread's network namespace.
pub fn open() -> std::io::Result<OwnedFd> {
    open_protocol(SockProtocol::NetlinkRoute).map_err(io)
}

/// [`nfnl`](super::nfnl)'s socket errors as I/O errors (the errno kept).
fn io(e: NfnlError) -> std::io::Error {
    match e {
        NfnlError::Socket(e) => e.into(),
        NfnlError::Kernel(e) => e,
        e => std::io::Error::other(e.to_string()),
    }
}

/// Answers are read into buffers this large: more than the kernel puts
/// in one (it caps a dump's batch at 32 KiB), so none is cut.
const RECV_BUF: usize = 64 * 1024;

/// Sends request `msg` (sequence `seq`, with `NLM_F_ACK`) and waits for
/// the kernel's answer: Ok, or the errno it refused with.
pub fn request(fd: &OwnedFd, msg: &[u8], seq: u32) -> std::io::Result<()> {
    send(fd, msg).map_err(io)?;
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = receive(fd, &mut buf).map_err(io)?;
        match ack_of(&buf[..n], seq) {
            Some(0) => return Ok(()),
            Some(e) => return Err(std::io::Error::from_raw_os_error(-e)),
            None => {}
        }
    }
}

/// Sends dump request `msg` and calls `each` with the type and bytes of
/// every message of the answer, until its end.
pub fn dump(fd: &OwnedFd, msg: &[u8], mut each: impl FnMut(u16, &[u8])) -> std::io::Result<()> {
    send(fd, msg).map_err(io)?;
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = receive(fd, &mut buf).map_err(io)?;
        if dump_messages(&buf[..n], &mut each).map_err(io)? {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_ne_bytes([b[i], b[i + 1]])
    }

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
    }

    /// What `ip link add sbx-1 up type veth peer name eth0 netns 7` sends:
    /// the host end (named, up), its link info (kind `veth`, data: the
    /// peer's `ifinfomsg` with its name and namespace fd).
    #[test]
    fn encodes_a_veth_pair_with_its_peer_in_a_namespace() {
        let m = new_veth("sbx-1", "eth0", 7, 5);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&m, 6), 0x605, "request, ack, excl, create");
        assert_eq!(u32_at(&m, 8), 5);
        let info = &m[16..32];
        assert_eq!((u32_at(info, 8), u32_at(info, 12)), (IFF_UP, IFF_UP));
        let a = &m[32..];
        assert_eq!(attr(a, IFLA_IFNAME), Some(&b"sbx-1\0"[..]));
        let li = attr(a, IFLA_LINKINFO).unwrap();
        assert_eq!(attr(li, IFLA_INFO_KIND), Some(&b"veth"[..]));
        let peer = attr(attr(li, IFLA_INFO_DATA).unwrap(), VETH_INFO_PEER).unwrap();
        assert_eq!(&peer[..16], &[0; 16]);
        assert_eq!(attr(&peer[16..], IFLA_IFNAME), Some(&b"eth0\0"[..]));
        assert_eq!(
            attr(&peer[16..], IFLA_NET_NS_FD),
            Some(&7u32.to_ne_bytes()[..])
        );
    }

    #[test]
    fn encodes_the_address_the_route_and_the_link_changes() {
        let a = new_p2p_addr(3, Ipv4Addr::new(10, 0, 0, 1), 1);
        assert_eq!(u16_at(&a, 4), RTM_NEWADDR);
        assert_eq!(&a[16..24], &[AF_INET, 31, 0, 0, 3, 0, 0, 0]);
        assert_eq!(attr(&a[24..], IFA_ADDRESS), Some(&[10, 0, 0, 1][..]));
        assert_eq!(attr(&a[24..], IFA_LOCAL), Some(&[10, 0, 0, 1][..]));
        assert_eq!(attrs(&a[24..]).count(), 2, "no broadcast address");
        let r = new_default_route(Ipv4Addr::new(10, 0, 0, 0), 2, 1);
        assert_eq!(u16_at(&r, 4), RTM_NEWROUTE);
        assert_eq!(&r[16..28], &[2, 0, 0, 0, 254, 4, 0, 1, 0, 0, 0, 0]);
        assert_eq!(attr(&r[28..], RTA_GATEWAY), Some(&[10, 0, 0, 0][..]));
        assert_eq!(attr(&r[28..], RTA_OIF), Some(&2u32.to_ne_bytes()[..]));
        let up = set_up(4, 1);
        assert_eq!(u16_at(&up, 4), RTM_SETLINK);
        assert_eq!(
            (u32_at(&up, 20), u32_at(&up, 24), u32_at(&up, 28)),
            (4, IFF_UP, IFF_UP)
        );
        let del = del_link(4, 1);
        assert_eq!((u16_at(&del, 4), u32_at(&del, 20)), (RTM_DELLINK, 4));
        assert_eq!(u16_at(&dump_links(1), 6), 0x301);
        assert_eq!(dump_routes(1)[16], AF_INET);
    }

    #[test]
    fn reads_links_and_routes_of_a_dump() {
        let mut a = Vec::new();
        push_attr(&mut a, IFLA_IFNAME, b"eth0\0");
        let link = message(RTM_NEWLINK, 2, 1, &ifinfomsg(9, 0, 0), &a);
        assert_eq!(parse_link(RTM_NEWLINK, &link), Some((9, "eth0".into())));
        assert_eq!(parse_link(RTM_NEWROUTE, &link), None);
        let mut h = [0u8; RTMSG_LEN];
        h[0] = AF_INET;
        h[1] = 24;
        let mut a = Vec::new();
        push_attr(&mut a, RTA_DST, &[192, 168, 1, 0]);
        push_attr(&mut a, RTA_OIF, &9u32.to_ne_bytes());
        let route = message(RTM_NEWROUTE, 2, 1, &h, &a);
        assert_eq!(
            parse_route(RTM_NEWROUTE, &route),
            Some(Route {
                dst: Ipv4Addr::new(192, 168, 1, 0),
                len: 24,
                oif: Some(9),
                via: false
            })
        );
        push_attr(&mut a, RTA_GATEWAY, &[192, 168, 1, 1]);
        let via = message(RTM_NEWROUTE, 2, 1, &h, &a);
        assert!(parse_route(RTM_NEWROUTE, &via).unwrap().via);
        h[0] = 10; // AF_INET6
        assert_eq!(
            parse_route(RTM_NEWROUTE, &message(RTM_NEWROUTE, 2, 1, &h, &[])),
            None
        );
    }
}
