//! Adding and removing one element of the table's `sandboxes` set over
//! nf_tables netlink, in one batch (one transaction), without running the
//! `nft` binary: a create or delete no longer pays a process spawn and
//! nft's cache fetch (5–10 ms each here). The table itself is still the
//! reviewed nft script of `nft.rs`, loaded by `nft` at start-up.
//!
//! The message is what `nft add element inet <table> sandboxes { "<link>"
//! . <addr> }` sends (checked with `strace` against nftables 1.0): a
//! `NEWSETELEM` (or `DELSETELEM`) between `BATCH_BEGIN` and `BATCH_END`,
//! whose key is the concatenation `ifname . ipv4_addr`: the interface name
//! zero-padded to 16 bytes, then the address in network order.
//!
//! The egress table's named counters (the drop reasons of `/metrics`) are
//! read here too, without `nft`: one `GETOBJ` dump of the counter objects
//! of `inet <table>` (what `nft list counters table inet <table>` asks,
//! less its cache fetch), so a scrape spawns no process.
//!
//! The socket, attribute and dump helpers below serve `ct.rs` as well,
//! and the attribute and dump helpers `rtnl.rs`.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_GETOBJ: u16 = 19;
const NFPROTO_INET: u8 = 1;

// Netlink's own (every family's): the header's flags and message types,
// the nested attribute flag.
pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
pub(super) const NLM_F_CREATE: u16 = 0x400;
pub(super) const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
pub(super) const NLMSG_DONE: u16 = 3;
pub(super) const NLA_F_NESTED: u16 = 0x8000;

const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;

/// The kernel's interface name size (the `ifname` type's width).
const IFNAMSIZ: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum NfnlError {
    #[error("nf_tables netlink socket: {0}")]
    Socket(nix::Error),
    #[error("nf_tables: {0}")]
    Kernel(std::io::Error),
    #[error("nf_tables: unexpected answer")]
    Protocol,
    #[error("interface name {0:?} is too long")]
    Name(String),
}

/// Add or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Delete,
}

pub(super) fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// A nested attribute around what `inner` appends.
pub(super) fn push_nested(buf: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    inner(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
}

/// The attributes of `a`: (type without flags, payload).
pub(super) fn attrs(mut a: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if a.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([a[0], a[1]]) as usize;
        let kind = u16::from_ne_bytes([a[2], a[3]]) & 0x3fff;
        if len < 4 || len > a.len() {
            return None;
        }
        let p = &a[4..len];
        a = &a[len.next_multiple_of(4).min(a.len())..];
        Some((kind, p))
    })
}

/// The payload of the first attribute of type `kind` in `a`.
pub(super) fn attr(a: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(a).find(|(k, _)| *k == kind).map(|(_, p)| p)
}

/// A string attribute's payload: NUL-terminated.
fn cstr(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}

/// The header (`nlmsghdr`, 16 bytes) of a netlink message `len` bytes
/// long in all; port id 0 (the kernel's).
pub(super) fn push_header(buf: &mut Vec<u8>, len: usize, kind: u16, flags: u16, seq: u32) {
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
}

/// One netlink message: header, `nfgenmsg`, attributes.
pub(super) fn push_msg(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[u8],
) {
    push_header(buf, 16 + 4 + attrs.len(), kind, flags, seq);
    buf.push(family);
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(attrs);
}

/// The batch that adds or deletes the element `link . addr` of set `set`
/// of table `inet <table>`; the element message carries sequence `seq`.
pub fn batch(
    op: Op,
    table: &str,
    set: &str,
    link: &str,
    addr: Ipv4Addr,
    seq: u32,
) -> Result<Vec<u8>, NfnlError> {
    if link.len() >= IFNAMSIZ {
        return Err(NfnlError::Name(link.to_string()));
    }
    let mut key = [0u8; IFNAMSIZ + 4];
    key[..link.len()].copy_from_slice(link.as_bytes());
    key[IFNAMSIZ..].copy_from_slice(&addr.octets());
    let mut attrs = Vec::with_capacity(96);
    push_attr(&mut attrs, NFTA_SET_ELEM_LIST_TABLE, &cstr(table));
    push_attr(&mut attrs, NFTA_SET_ELEM_LIST_SET, &cstr(set));
    push_nested(&mut attrs, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
        push_nested(b, NFTA_LIST_ELEM, |b| {
            push_nested(b, NFTA_SET_ELEM_KEY, |b| {
                push_attr(b, NFTA_DATA_VALUE, &key)
            });
        });
    });
    let (kind, flags) = match op {
        Op::Add => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK),
        Op::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
    };
    let mut buf = Vec::with_capacity(160);
    let sub = NFNL_SUBSYS_NFTABLES;
    push_msg(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq.wrapping_sub(1),
        0,
        sub,
        &[],
    );
    push_msg(
        &mut buf,
        (sub << 8) | kind,
        flags,
        seq,
        NFPROTO_INET,
        0,
        &attrs,
    );
    push_msg(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq.wrapping_add(1),
        0,
        sub,
        &[],
    );
    Ok(buf)
}

/// The errno of the kernel's answer to message `seq` (0: done), or None
/// when `msg` holds no answer to it.
pub(super) fn ack_of(msg: &[u8], seq: u32) -> Option<i32> {
    let mut off = 0;
    while off + 16 <= msg.len() {
        let len = u32::from_ne_bytes(msg[off..off + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(msg[off + 4..off + 6].try_into().ok()?);
        let mseq = u32::from_ne_bytes(msg[off + 8..off + 12].try_into().ok()?);
        if len < 16 || off + len > msg.len() {
            return None;
        }
        if kind == NLMSG_ERROR && mseq == seq && len >= 20 {
            return Some(i32::from_ne_bytes(msg[off + 16..off + 20].try_into().ok()?));
        }
        off += len.next_multiple_of(4);
    }
    None
}

/// A netfilter netlink socket (of the calling thread's network namespace).
pub(super) fn open() -> Result<OwnedFd, NfnlError> {
    open_protocol(SockProtocol::NetlinkNetFilter)
}

/// A netlink socket of `protocol` (of the calling thread's network
/// namespace).
pub(super) fn open_protocol(protocol: SockProtocol) -> Result<OwnedFd, NfnlError> {
    socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        protocol,
    )
    .map_err(NfnlError::Socket)
}

/// Sends `msg` to the kernel.
pub(super) fn send(fd: &OwnedFd, msg: &[u8]) -> Result<(), NfnlError> {
    sendto(
        fd.as_raw_fd(),
        msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map(drop)
    .map_err(NfnlError::Socket)
}

/// Receives one buffer of answers; its length.
pub(super) fn receive(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize, NfnlError> {
    loop {
        match recv(fd.as_raw_fd(), buf, MsgFlags::empty()) {
            Ok(0) => return Err(NfnlError::Protocol),
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(NfnlError::Socket(e)),
        }
    }
}

/// Calls `each` with the type and the bytes (header included) of every
/// message in one buffer of dump answers; true when the dump's end
/// (`NLMSG_DONE`) is in it. An `NLMSG_ERROR` with an errno is the error.
pub(super) fn dump_messages(
    buf: &[u8],
    mut each: impl FnMut(u16, &[u8]),
) -> Result<bool, NfnlError> {
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
        if len < 16 || off + len > buf.len() {
            return Err(NfnlError::Protocol);
        }
        let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
        let m = &buf[off..off + len];
        off += len.next_multiple_of(4);
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let e = i32::from_ne_bytes(
                    m.get(16..20)
                        .ok_or(NfnlError::Protocol)?
                        .try_into()
                        .unwrap(),
                );
                if e != 0 {
                    return Err(NfnlError::Kernel(std::io::Error::from_raw_os_error(-e)));
                }
            }
            k => each(k, m),
        }
    }
    Ok(false)
}

/// The dump request of the counter objects of table `inet <table>`
/// (`NFT_MSG_GETOBJ`, `NLM_F_DUMP`; the kernel filters by family, table
/// and object type).
pub fn counters_request(table: &str, seq: u32) -> Vec<u8> {
    let mut attrs = Vec::with_capacity(32);
    push_attr(&mut attrs, NFTA_OBJ_TABLE, &cstr(table));
    push_attr(&mut attrs, NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes());
    let mut buf = Vec::with_capacity(20 + attrs.len());
    push_msg(
        &mut buf,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        NFPROTO_INET,
        0,
        &attrs,
    );
    buf
}

/// A named counter of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

/// The counters of `inet <table>` in one buffer of answers to
/// [`counters_request`], appended to `out`; true at the dump's end.
/// Objects of another table, family or type are skipped (older kernels
/// filter less).
pub fn parse_counters(buf: &[u8], table: &str, out: &mut Vec<Counter>) -> Result<bool, NfnlError> {
    let newobj = (NFNL_SUBSYS_NFTABLES << 8) | (NFT_MSG_GETOBJ - 1);
    dump_messages(buf, |kind, m| {
        if kind != newobj || m.len() < 20 || m[16] != NFPROTO_INET {
            return;
        }
        let a = &m[20..];
        let name = |k| attr(a, k).map(|v| v.strip_suffix(b"\0").unwrap_or(v));
        let be64 = |d: &[u8], k| {
            attr(d, k)
                .and_then(|v| v.try_into().ok())
                .map(u64::from_be_bytes)
        };
        if name(NFTA_OBJ_TABLE) != Some(table.as_bytes())
            || attr(a, NFTA_OBJ_TYPE) != Some(&NFT_OBJECT_COUNTER.to_be_bytes()[..])
        {
            return;
        }
        let (Some(n), Some(d)) = (name(NFTA_OBJ_NAME), attr(a, NFTA_OBJ_DATA)) else {
            return;
        };
        if let (Some(packets), Some(bytes)) =
            (be64(d, NFTA_COUNTER_PACKETS), be64(d, NFTA_COUNTER_BYTES))
        {
            out.push(Counter {
                name: String::from_utf8_lossy(n).into_owned(),
                packets,
                bytes,
            });
        }
    })
}

/// The named counters of table `inet <table>` (of the calling thread's
/// network namespace), over netlink. A missing table has none (the dump
/// is empty).
pub fn counters(table: &str) -> Result<Vec<Counter>, NfnlError> {
    let fd = open()?;
    send(&fd, &counters_request(table, 1))?;
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = Vec::new();
    loop {
        let n = receive(&fd, &mut buf)?;
        match parse_counters(&buf[..n], table, &mut out) {
            Ok(true) => return Ok(out),
            Ok(false) => {}
            Err(NfnlError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends the element change in one transaction and waits for the
/// kernel's answer. Deleting an element that is not there, or adding one
/// that is, is not an error.
pub fn change_element(
    op: Op,
    table: &str,
    set: &str,
    link: &str,
    addr: Ipv4Addr,
) -> Result<(), NfnlError> {
    let fd = open()?;
    let seq = 2;
    send(&fd, &batch(op, table, set, link, addr, seq)?)?;
    let mut buf = vec![0u8; 8192];
    loop {
        let n = receive(&fd, &mut buf)?;
        let Some(err) = ack_of(&buf[..n], seq) else {
            continue;
        };
        return match (-err, op) {
            (0, _) => Ok(()),
            (libc::ENOENT, Op::Delete) | (libc::EEXIST, Op::Add) => Ok(()),
            (e, _) => Err(NfnlError::Kernel(std::io::Error::from_raw_os_error(e))),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `nft add element inet sbxpf sandboxes { "pf-9" .
    /// 10.251.0.19 }` sends for the element (from `strace -xx`), less the
    /// optional set id attribute.
    #[test]
    fn encodes_what_nft_sends() {
        let b = batch(
            Op::Add,
            "sbxpf",
            "sandboxes",
            "pf-9",
            "10.251.0.19".parse().unwrap(),
            1,
        )
        .unwrap();
        // BATCH_BEGIN, the element message, BATCH_END.
        assert_eq!(b.len(), 20 + 84 + 20);
        let m = &b[20..104];
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), (10 << 8) | 12);
        let attrs = &m[20..];
        let expect_tail: &[u8] = b"\x20\x00\x01\x80\x1c\x00\x01\x80\x18\x00\x01\x00\x70\x66\x2d\x39\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0a\xfb\x00\x13";
        // table "sbxpf\0" (10 → 12), set "sandboxes\0" (14 → 16), then the
        // nested elements attribute.
        assert_eq!(&attrs[..10], b"\x0a\x00\x01\x00sbxpf\x00");
        assert_eq!(&attrs[12..26], b"\x0e\x00\x02\x00sandboxes\x00");
        assert_eq!(&attrs[28..32], b"\x24\x00\x03\x80");
        assert_eq!(&attrs[32..], expect_tail);
        assert!(batch(
            Op::Add,
            "t",
            "s",
            "a-very-long-name",
            Ipv4Addr::LOCALHOST,
            1
        )
        .is_err());
    }

    #[test]
    fn finds_the_answer_to_its_message() {
        let mut m = Vec::new();
        // An NLMSG_ERROR for seq 2 with errno -2.
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&2u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&(-2i32).to_ne_bytes());
        m.extend_from_slice(&[0; 16]);
        assert_eq!(ack_of(&m, 2), Some(-2));
        assert_eq!(ack_of(&m, 3), None);
    }

    /// The request: header (length, `NFT_MSG_GETOBJ` of nf_tables, a dump
    /// request, the sequence), `nfgenmsg` (inet, version 0, res_id 0),
    /// the table and the object type (counter, big-endian).
    #[test]
    fn encodes_the_counter_dump_request() {
        let r = counters_request("sbxpf", 7);
        assert_eq!(r.len(), 16 + 4 + 12 + 8);
        assert_eq!(&r[0..4], &40u32.to_ne_bytes());
        assert_eq!(u16::from_ne_bytes([r[4], r[5]]), 0x0a13);
        assert_eq!(u16::from_ne_bytes([r[6], r[7]]), 0x0301);
        assert_eq!(&r[8..12], &7u32.to_ne_bytes());
        assert_eq!(&r[12..16], &[0; 4]);
        assert_eq!(&r[16..20], &[1, 0, 0, 0]);
        let mut table = 10u16.to_ne_bytes().to_vec();
        table.extend_from_slice(&1u16.to_ne_bytes());
        table.extend_from_slice(b"sbxpf\0\0\0");
        assert_eq!(&r[20..32], &table[..]);
        let mut kind = 8u16.to_ne_bytes().to_vec();
        kind.extend_from_slice(&3u16.to_ne_bytes());
        kind.extend_from_slice(&[0, 0, 0, 1]);
        assert_eq!(&r[32..40], &kind[..]);
    }

    /// A `NEWOBJ` answer as the kernel sends it (`nf_tables_fill_obj_info`):
    /// table, name, type, data (counter bytes and packets, big-endian, not
    /// flagged nested), use, handle.
    fn obj(table: &str, name: &str, kind: u32, family: u8, packets: u64, bytes: u64) -> Vec<u8> {
        let mut data = Vec::new();
        push_attr(&mut data, NFTA_COUNTER_BYTES, &bytes.to_be_bytes());
        push_attr(&mut data, NFTA_COUNTER_PACKETS, &packets.to_be_bytes());
        let mut a = Vec::new();
        push_attr(&mut a, NFTA_OBJ_TABLE, &cstr(table));
        push_attr(&mut a, NFTA_OBJ_NAME, &cstr(name));
        push_attr(&mut a, NFTA_OBJ_TYPE, &kind.to_be_bytes());
        push_attr(&mut a, NFTA_OBJ_DATA, &data);
        push_attr(&mut a, 5, &1u32.to_be_bytes());
        push_attr(&mut a, 6, &9u64.to_be_bytes());
        let mut m = Vec::new();
        push_msg(&mut m, (10 << 8) | 18, 0x2, 1, family, 0x1234, &a);
        m
    }

    #[test]
    fn parses_the_counters_of_its_table_until_the_end_of_the_dump() {
        let mut buf = obj("sbxpf", "denied", 1, NFPROTO_INET, 3, 180);
        buf.extend(obj("sbxpf", "conn_limit", 1, NFPROTO_INET, 1 << 40, 7));
        // Another table, another family, a quota object: skipped.
        buf.extend(obj("other", "denied", 1, NFPROTO_INET, 5, 5));
        buf.extend(obj("sbxpf", "denied", 1, 2, 5, 5));
        buf.extend(obj("sbxpf", "q", 2, NFPROTO_INET, 5, 5));
        let mut out = Vec::new();
        assert!(!parse_counters(&buf, "sbxpf", &mut out).unwrap());
        let c = |name: &str, packets, bytes| Counter {
            name: name.into(),
            packets,
            bytes,
        };
        assert_eq!(out, vec![c("denied", 3, 180), c("conn_limit", 1 << 40, 7)]);
        // The next read: the end of the dump.
        let mut done = Vec::new();
        push_msg(&mut done, NLMSG_DONE, 0x2, 1, 0, 0, &[]);
        assert!(parse_counters(&done, "sbxpf", &mut out).unwrap());
        assert_eq!(out.len(), 2);
        // An error answer is the error; a truncated message is refused.
        let mut err = Vec::new();
        err.extend_from_slice(&36u32.to_ne_bytes());
        err.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err.extend_from_slice(&[0; 10]);
        err.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        err.extend_from_slice(&[0; 16]);
        assert!(matches!(
            parse_counters(&err, "sbxpf", &mut out),
            Err(NfnlError::Kernel(e)) if e.raw_os_error() == Some(libc::EPERM)
        ));
        let whole = obj("sbxpf", "denied", 1, NFPROTO_INET, 3, 180);
        assert!(matches!(
            parse_counters(&whole[..whole.len() - 4], "sbxpf", &mut out),
            Err(NfnlError::Protocol)
        ));
    }
}
