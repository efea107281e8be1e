//! Route netlink (`NETLINK_ROUTE`) requests the daemon sends, as `ip`
//! sends them: a veth pair whose peer is made inside a sandbox's network
//! namespace, a /31 address, a link set up, a default route, a link
//! deleted, and the link and IPv4 route dumps of the start-up checks. The
//! messages are built and read with `netlink-packet-route` (the
//! rust-netlink project's wire types, which rtnetlink is made of, without
//! its async connection and its second `nix`); the socket calls are
//! [`nfnl`](super::nfnl)'s and synchronous: [`link`](super::link) runs
//! them on its own thread.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{OwnedFd, RawFd};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::sys::socket::SockProtocol;

use super::nfnl::{ack_of, dump_messages, open_protocol, receive, send, NfnlError};

/// `msg` as the bytes of one netlink message with `flags` and `seq`.
fn message(msg: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    m.finalize();
    let mut b = vec![0u8; m.buffer_len()];
    m.serialize(&mut b);
    b
}

const CREATE: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE;

/// A link message of link `index`, up when `up` (and only that flag
/// changed).
fn link(index: u32, up: bool) -> LinkMessage {
    let mut l = LinkMessage::default();
    l.header.index = index;
    if up {
        l.header.flags = LinkFlags::Up;
        l.header.change_mask = LinkFlags::Up;
    }
    l
}

/// `ip link add <name> up type veth peer name <peer> netns <fd>`: the pair
/// in one request, the peer created directly in the namespace of `netns`.
pub fn new_veth(name: &str, peer: &str, netns: RawFd, seq: u32) -> Vec<u8> {
    let mut p = link(0, false);
    p.attributes = vec![
        LinkAttribute::IfName(peer.into()),
        LinkAttribute::NetNsFd(netns),
    ];
    let mut l = link(0, true);
    l.attributes = vec![
        LinkAttribute::IfName(name.into()),
        LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))),
        ]),
    ];
    message(RouteNetlinkMessage::NewLink(l), CREATE, seq)
}

/// `ip link del` of link `index`.
pub fn del_link(index: u32, seq: u32) -> Vec<u8> {
    let m = RouteNetlinkMessage::DelLink(link(index, false));
    message(m, NLM_F_REQUEST | NLM_F_ACK, seq)
}

/// `ip link set <index> up`.
pub fn set_up(index: u32, seq: u32) -> Vec<u8> {
    let m = RouteNetlinkMessage::SetLink(link(index, true));
    message(m, NLM_F_REQUEST | NLM_F_ACK, seq)
}

/// `ip addr add <addr>/31 dev <index>`: address and local address, no
/// broadcast address (on a /31 the prefix's last address is the peer: the
/// kernel would then treat the peer's address as broadcast and never route
/// to it).
pub fn new_p2p_addr(index: u32, addr: Ipv4Addr, seq: u32) -> Vec<u8> {
    let mut a = AddressMessage::default();
    a.header.family = AddressFamily::Inet;
    a.header.prefix_len = 31;
    a.header.index = index;
    a.attributes = vec![
        AddressAttribute::Address(IpAddr::V4(addr)),
        AddressAttribute::Local(IpAddr::V4(addr)),
    ];
    message(RouteNetlinkMessage::NewAddress(a), CREATE, seq)
}

/// `ip route add default via <gateway> dev <index>` (main table, static).
pub fn new_default_route(gateway: Ipv4Addr, index: u32, seq: u32) -> Vec<u8> {
    let mut r = RouteMessage::default();
    r.header.address_family = AddressFamily::Inet;
    r.header.table = RouteHeader::RT_TABLE_MAIN;
    r.header.protocol = RouteProtocol::Static;
    r.header.scope = RouteScope::Universe;
    r.header.kind = RouteType::Unicast;
    r.attributes = vec![
        RouteAttribute::Gateway(RouteAddress::Inet(gateway)),
        RouteAttribute::Oif(index),
    ];
    message(RouteNetlinkMessage::NewRoute(r), CREATE, seq)
}

/// The dump request of every link.
pub fn dump_links(seq: u32) -> Vec<u8> {
    let m = RouteNetlinkMessage::GetLink(LinkMessage::default());
    message(m, NLM_F_REQUEST | NLM_F_DUMP, seq)
}

/// The dump request of every IPv4 route (all tables).
pub fn dump_routes(seq: u32) -> Vec<u8> {
    let mut r = RouteMessage::default();
    r.header.address_family = AddressFamily::Inet;
    message(
        RouteNetlinkMessage::GetRoute(r),
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
    )
}

/// The route netlink message in `m` (one message, header included).
fn parse(m: &[u8]) -> Option<RouteNetlinkMessage> {
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(m)
        .ok()?
        .payload
    {
        NetlinkPayload::InnerMessage(r) => Some(r),
        _ => None,
    }
}

/// A link of a dump: its index and name.
pub fn parse_link(m: &[u8]) -> Option<(u32, String)> {
    let RouteNetlinkMessage::NewLink(l) = parse(m)? else {
        return None;
    };
    l.attributes.into_iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some((l.header.index, n)),
        _ => None,
    })
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
pub fn parse_route(m: &[u8]) -> Option<Route> {
    let RouteNetlinkMessage::NewRoute(m) = parse(m)? else {
        return None;
    };
    if m.header.address_family != AddressFamily::Inet {
        return None;
    }
    let mut r = Route {
        dst: Ipv4Addr::UNSPECIFIED,
        len: m.header.destination_prefix_length,
        oif: None,
        via: false,
    };
    for a in m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => r.dst = d,
            RouteAttribute::Oif(i) => r.oif = Some(i),
            RouteAttribute::Gateway(_) | RouteAttribute::MultiPath(_) | RouteAttribute::Via(_) => {
                r.via = true
            }
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

/// Sends dump request `msg` and calls `each` with the bytes of every
/// message of the answer, until its end.
pub fn dump(fd: &OwnedFd, msg: &[u8], mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
    send(fd, msg).map_err(io)?;
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = receive(fd, &mut buf).map_err(io)?;
        if dump_messages(&buf[..n], |_, m| each(m)).map_err(io)? {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::nfnl::attr;
    use super::*;

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_ne_bytes([b[i], b[i + 1]])
    }

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
    }

    /// What `ip link add sbx-1 up type veth peer name eth0 netns 7` sends
    /// (the bytes checked against the kernel's layout, not against the
    /// crate that made them): the host end (named, up), its link info
    /// (kind `veth`, data: the peer's `ifinfomsg` with its name and
    /// namespace fd).
    #[test]
    fn encodes_a_veth_pair_with_its_peer_in_a_namespace() {
        let m = new_veth("sbx-1", "eth0", 7, 5);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), libc::RTM_NEWLINK);
        assert_eq!(u16_at(&m, 6), 0x605, "request, ack, excl, create");
        assert_eq!(u32_at(&m, 8), 5);
        let info = &m[16..32];
        let up = libc::IFF_UP as u32;
        assert_eq!((u32_at(info, 8), u32_at(info, 12)), (up, up));
        let a = &m[32..];
        assert_eq!(attr(a, libc::IFLA_IFNAME), Some(&b"sbx-1\0"[..]));
        let li = attr(a, libc::IFLA_LINKINFO).unwrap();
        // NUL-terminated, as the kernel also takes it (`ip` leaves the NUL out).
        assert_eq!(attr(li, libc::IFLA_INFO_KIND), Some(&b"veth\0"[..]));
        let peer = attr(attr(li, libc::IFLA_INFO_DATA).unwrap(), 1).unwrap();
        assert_eq!(&peer[..16], &[0; 16]);
        assert_eq!(attr(&peer[16..], libc::IFLA_IFNAME), Some(&b"eth0\0"[..]));
        assert_eq!(
            attr(&peer[16..], libc::IFLA_NET_NS_FD),
            Some(&7u32.to_ne_bytes()[..])
        );
    }

    #[test]
    fn encodes_the_address_the_route_and_the_link_changes() {
        let a = new_p2p_addr(3, Ipv4Addr::new(10, 0, 0, 1), 1);
        assert_eq!(u16_at(&a, 4), libc::RTM_NEWADDR);
        assert_eq!(&a[16..24], &[2, 31, 0, 0, 3, 0, 0, 0]);
        assert_eq!(attr(&a[24..], libc::IFA_ADDRESS), Some(&[10, 0, 0, 1][..]));
        assert_eq!(attr(&a[24..], libc::IFA_LOCAL), Some(&[10, 0, 0, 1][..]));
        assert_eq!(attr(&a[24..], libc::IFA_BROADCAST), None, "no broadcast");
        assert_eq!(a.len(), 24 + 2 * 8, "two attributes only");
        let r = new_default_route(Ipv4Addr::new(10, 0, 0, 0), 2, 1);
        assert_eq!(u16_at(&r, 4), libc::RTM_NEWROUTE);
        assert_eq!(&r[16..28], &[2, 0, 0, 0, 254, 4, 0, 1, 0, 0, 0, 0]);
        assert_eq!(attr(&r[28..], libc::RTA_GATEWAY), Some(&[10, 0, 0, 0][..]));
        assert_eq!(attr(&r[28..], libc::RTA_OIF), Some(&2u32.to_ne_bytes()[..]));
        let up = set_up(4, 1);
        assert_eq!(u16_at(&up, 4), libc::RTM_SETLINK);
        let iff_up = libc::IFF_UP as u32;
        assert_eq!(
            (u32_at(&up, 20), u32_at(&up, 24), u32_at(&up, 28)),
            (4, iff_up, iff_up)
        );
        let del = del_link(4, 1);
        assert_eq!((u16_at(&del, 4), u32_at(&del, 20)), (libc::RTM_DELLINK, 4));
        assert_eq!(u16_at(&dump_links(1), 6), 0x301);
        assert_eq!(dump_routes(1)[16], 2, "AF_INET");
    }

    #[test]
    fn reads_links_and_routes_of_a_dump() {
        let mut l = link(9, false);
        l.attributes = vec![LinkAttribute::IfName("eth0".into())];
        let bytes = message(RouteNetlinkMessage::NewLink(l), 2, 1);
        assert_eq!(parse_link(&bytes), Some((9, "eth0".into())));
        assert_eq!(parse_route(&bytes), None);
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.destination_prefix_length = 24;
        r.attributes = vec![
            RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(192, 168, 1, 0))),
            RouteAttribute::Oif(9),
        ];
        let route = message(RouteNetlinkMessage::NewRoute(r.clone()), 2, 1);
        assert_eq!(
            parse_route(&route),
            Some(Route {
                dst: Ipv4Addr::new(192, 168, 1, 0),
                len: 24,
                oif: Some(9),
                via: false
            })
        );
        r.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(
                192, 168, 1, 1,
            ))));
        let via = message(RouteNetlinkMessage::NewRoute(r.clone()), 2, 1);
        assert!(parse_route(&via).unwrap().via);
        r.header.address_family = AddressFamily::Inet6;
        r.attributes.clear();
        let v6 = message(RouteNetlinkMessage::NewRoute(r), 2, 1);
        assert_eq!(parse_route(&v6), None);
    }
}
