//! Deleting every conntrack entry of one address over ctnetlink (the
//! `conntrack -D -s ADDR` plus `conntrack -D -d ADDR` equivalent, both
//! directions, every protocol), before a deleted sandbox's address goes
//! back to the pool (#32 §2): an entry outliving the sandbox would deliver
//! its flows (a UDP reply to port 40000, say) to the next sandbox on that
//! address, and count against its connection limit.
//!
//! As `conntrack -D` does: one dump of the IPv4 table
//! (`IPCTNL_MSG_CT_GET`, `NLM_F_DUMP`), the entries whose original or reply
//! tuple names the address picked out here, then one `IPCTNL_MSG_CT_DELETE`
//! per entry naming it by its original tuple (and zone), as the kernel
//! reported it.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

#[cfg(test)]
use super::nfnl::NLMSG_DONE;
use super::nfnl::{
    ack_of, attr, dump_messages, open, push_attr, push_msg, receive, send, NfnlError, NLA_F_NESTED,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const AF_INET: u8 = libc::AF_INET as u8;

/// One netlink message of ctnetlink: header, `nfgenmsg` (IPv4), `attrs`.
fn message(kind: u16, flags: u16, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + attrs.len());
    let kind = (NFNL_SUBSYS_CTNETLINK << 8) | kind;
    push_msg(&mut b, kind, flags, seq, AF_INET, 0, attrs);
    b
}

/// The dump request of the IPv4 conntrack table.
pub fn dump_request(seq: u32) -> Vec<u8> {
    message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, &[])
}

/// The delete of the entry whose original tuple attribute (payload,
/// nested) is `orig`, in zone `zone` (its raw attribute, when it had one).
pub fn delete_request(orig: &[u8], zone: Option<&[u8]>, seq: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(8 + orig.len());
    push_attr(&mut a, CTA_TUPLE_ORIG | NLA_F_NESTED, orig);
    if let Some(z) = zone {
        push_attr(&mut a, CTA_ZONE, z);
    }
    message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, &a)
}

/// Whether tuple `t` (the payload of `CTA_TUPLE_*`) has `addr` as its
/// source or destination.
fn names(t: &[u8], addr: Ipv4Addr) -> bool {
    let Some(ip) = attr(t, CTA_TUPLE_IP) else {
        return false;
    };
    [CTA_IP_V4_SRC, CTA_IP_V4_DST]
        .iter()
        .any(|k| attr(ip, *k) == Some(&addr.octets()[..]))
}

/// An entry to delete: its original tuple and zone attributes' payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub orig: Vec<u8>,
    pub zone: Option<Vec<u8>>,
}

/// The entries in one buffer of dump answers that name `addr` in either
/// tuple; `done` when the dump's end is in it.
pub fn matching(buf: &[u8], addr: Ipv4Addr, out: &mut Vec<Entry>) -> Result<bool, NfnlError> {
    dump_messages(buf, |kind, m| {
        if kind != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW || m.len() < 20 {
            return;
        }
        let a = &m[20..];
        let orig = attr(a, CTA_TUPLE_ORIG);
        let reply = attr(a, CTA_TUPLE_REPLY);
        if orig.is_some_and(|t| names(t, addr)) || reply.is_some_and(|t| names(t, addr)) {
            if let Some(o) = orig {
                out.push(Entry {
                    orig: o.to_vec(),
                    zone: attr(a, CTA_ZONE).map(<[u8]>::to_vec),
                });
            }
        }
    })
}

/// Deletes every IPv4 conntrack entry (of the calling thread's network
/// namespace) with `addr` as a source or destination of either direction;
/// how many were deleted. An entry that went away meanwhile is not an
/// error.
pub fn delete_address(addr: Ipv4Addr) -> Result<usize, NfnlError> {
    let fd = open()?;
    let mut buf = vec![0u8; 64 * 1024];
    let found = find(&fd, &mut buf, addr)?;
    let mut deleted = 0;
    for (i, e) in found.iter().enumerate() {
        let seq = 2 + i as u32;
        send(&fd, &delete_request(&e.orig, e.zone.as_deref(), seq))?;
        loop {
            let n = receive(&fd, &mut buf)?;
            let Some(err) = ack_of(&buf[..n], seq) else {
                continue;
            };
            match -err {
                0 => deleted += 1,
                libc::ENOENT => {}
                e => return Err(NfnlError::Kernel(std::io::Error::from_raw_os_error(e))),
            }
            break;
        }
    }
    Ok(deleted)
}

/// The entries naming `addr` (one dump).
fn find(fd: &OwnedFd, buf: &mut [u8], addr: Ipv4Addr) -> Result<Vec<Entry>, NfnlError> {
    send(fd, &dump_request(1))?;
    let mut found = Vec::new();
    loop {
        let n = receive(fd, buf)?;
        if matching(&buf[..n], addr, &mut found)? {
            return Ok(found);
        }
    }
}

/// How many IPv4 conntrack entries (of the calling thread's network
/// namespace) name `addr` in either direction.
pub fn count_address(addr: Ipv4Addr) -> Result<usize, NfnlError> {
    let fd = open()?;
    let mut buf = vec![0u8; 64 * 1024];
    Ok(find(&fd, &mut buf, addr)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The original tuple of a UDP flow 10.243.0.1:40000 -> 198.51.100.10:53.
    fn tuple(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut ip = Vec::new();
        push_attr(&mut ip, CTA_IP_V4_SRC, &src);
        push_attr(&mut ip, CTA_IP_V4_DST, &dst);
        let mut proto = Vec::new();
        push_attr(&mut proto, 1, &[17]);
        push_attr(&mut proto, 2, &40000u16.to_be_bytes());
        push_attr(&mut proto, 3, &53u16.to_be_bytes());
        let mut t = Vec::new();
        push_attr(&mut t, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
        push_attr(&mut t, 2 | NLA_F_NESTED, &proto);
        t
    }

    fn entry(orig: &[u8], reply: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        push_attr(&mut a, CTA_TUPLE_ORIG | NLA_F_NESTED, orig);
        push_attr(&mut a, CTA_TUPLE_REPLY | NLA_F_NESTED, reply);
        message(IPCTNL_MSG_CT_NEW, 0x2, 1, &a)
    }

    #[test]
    fn picks_the_entries_of_the_address_in_either_tuple() {
        let me = [10, 243, 0, 1];
        let (other, remote, host) = ([10, 243, 0, 3], [198, 51, 100, 10], [203, 0, 113, 1]);
        let out_flow = tuple(me, remote);
        let mut buf = entry(&out_flow, &tuple(remote, host));
        // Inbound to it (the reply tuple's destination).
        buf.extend(entry(&tuple(remote, host), &tuple(host, me)));
        // Someone else's.
        buf.extend(entry(&tuple(other, remote), &tuple(remote, host)));
        let mut found = Vec::new();
        assert!(!matching(&buf, Ipv4Addr::from(me), &mut found).unwrap());
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].orig, out_flow);
        // The delete names the entry by that tuple, nested, with an ack.
        let d = delete_request(&found[0].orig, None, 9);
        assert_eq!(u16::from_ne_bytes([d[4], d[5]]), (1 << 8) | 2);
        assert_eq!(u16::from_ne_bytes([d[6], d[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(d[16], AF_INET);
        assert_eq!(
            u16::from_ne_bytes([d[22], d[23]]),
            CTA_TUPLE_ORIG | NLA_F_NESTED
        );
        assert_eq!(&d[24..], &out_flow[..]);
        // The end of the dump.
        let mut done = Vec::new();
        done.extend_from_slice(&20u32.to_ne_bytes());
        done.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        done.extend_from_slice(&[0; 14]);
        assert!(matching(&done, Ipv4Addr::from(me), &mut found).unwrap());
        let r = dump_request(1);
        assert_eq!(u16::from_ne_bytes([r[4], r[5]]), (1 << 8) | 1);
        assert_eq!(u16::from_ne_bytes([r[6], r[7]]), 0x301);
    }
}
