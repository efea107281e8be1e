//! The daemon's nftables table (`inet <table>`, default `inet sandboxd`):
//! rendered here as an nft script and loaded by the `nft` binary in one
//! transaction; per-sandbox changes are elements of the `sandboxes` set.
//! No other table is ever touched.

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::addr::{Cidr, Hole};

/// The built-in deny list (IPv4): everything that is not the internet
/// (the special-purpose ranges of RFC 6890 that are not globally
/// reachable, multicast included). The networks of the host's own
/// interfaces are added at start-up (see `Policy::host_nets`).
pub const DENY4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// The built-in deny list (IPv6; IPv6 egress is off anyway): loopback,
/// IPv4-mapped, NAT64 (RFC 6052, RFC 8215), discard, IETF protocol
/// assignments, documentation, unique local, link-local, multicast.
pub const DENY6: &[&str] = &[
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// The drop counters, by reason (also the metric's label values).
pub const DROP_REASONS: &[&str] = &["denied", "to_host", "spoofed", "ipv6", "conn_limit"];

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run {nft}: {source} (install the nftables package)")]
    Spawn { nft: String, source: std::io::Error },
    #[error("nft failed: {0}")]
    Failed(String),
}

/// What the table is made from.
#[derive(Debug, Clone)]
pub struct Policy {
    pub table: String,
    pub link_prefix: String,
    pub subnet: Cidr,
    pub allow: Vec<Hole>,
    pub deny: Vec<Cidr>,
    pub max_connections: u32,
    pub resolvers: Vec<Ipv4Addr>,
    /// The networks of the host's interfaces and its own addresses (its
    /// directly connected and local routes), denied like the built-in list.
    pub host_nets: Vec<Cidr>,
}

/// The nft binary.
#[derive(Debug, Clone)]
pub struct Nft {
    program: String,
}

impl Default for Nft {
    fn default() -> Self {
        Nft {
            program: "nft".into(),
        }
    }
}

/// `{ a, b }` (nft anonymous set) or the single element.
fn set_of<T: std::fmt::Display>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    if v.len() == 1 {
        v[0].clone()
    } else {
        format!("{{ {} }}", v.join(", "))
    }
}

/// An element of the `sandboxes` set: the host end's name and the address
/// the sandbox must send from.
pub fn element(link: &str, addr: Ipv4Addr) -> String {
    format!("\"{link}\" . {addr}")
}

impl Policy {
    /// The whole table (replacing any previous one in the same
    /// transaction), with `elements` in the `sandboxes` set.
    pub fn render(&self, elements: &[String]) -> String {
        let t = &self.table;
        let sbx = format!("\"{}*\"", self.link_prefix);
        let deny4 = self.deny4();
        let mut s = String::new();
        // Creating then deleting makes the delete safe when the table does
        // not exist yet; all of it is one transaction.
        s += &format!("table inet {t}\ndelete table inet {t}\n");
        s += &format!("table inet {t} {{\n");
        for r in DROP_REASONS {
            s += &format!("\tcounter {r} {{ }}\n");
        }
        s += "\tset sandboxes {\n\t\ttype ifname . ipv4_addr\n";
        if !elements.is_empty() {
            s += &format!("\t\telements = {{ {} }}\n", elements.join(", "));
        }
        s += "\t}\n";
        s += &format!(
            "\tset deny4 {{\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\tauto-merge\n\t\telements = {{ {} }}\n\t}}\n",
            deny4.join(", ")
        );
        s += &format!(
            "\tset deny6 {{\n\t\ttype ipv6_addr\n\t\tflags interval\n\t\tauto-merge\n\t\telements = {{ {} }}\n\t}}\n",
            DENY6.join(", ")
        );
        s += "\tset conns {\n\t\ttype ifname\n\t\tsize 65535\n\t\tflags dynamic\n\t}\n";
        // Forwarded traffic: from a sandbox through the policy; to a
        // sandbox only replies.
        s += "\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n";
        s += &format!("\t\tiifname {sbx} jump from_sandbox\n");
        s += &format!("\t\toifname {sbx} ct state established,related accept\n");
        s += &format!("\t\toifname {sbx} drop\n\t}}\n");
        s += "\tchain from_sandbox {\n";
        s += "\t\tiifname . ip saddr != @sandboxes counter name \"spoofed\" drop\n";
        s += "\t\tmeta nfproto ipv6 counter name \"ipv6\" drop\n";
        // The cap counts every new connection, holes and DNS included (it
        // only drops, so it may come first).
        s += &format!(
            "\t\tct state new add @conns {{ iifname ct count over {} }} counter name \"conn_limit\" drop\n",
            self.max_connections
        );
        // Stateless: every packet meets the holes and the deny list, so a
        // flow admitted under an older policy (or by an older table) is
        // not carried past this one by an `established` accept.
        s += &self.holes("\t\t", "accept");
        s += "\t\tip daddr @deny4 counter name \"denied\" drop\n";
        s += "\t\tip6 daddr @deny6 counter name \"denied\" drop\n";
        s += "\t\taccept\n\t}\n";
        // Traffic to the host itself (any of its addresses).
        s += "\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n";
        s += &format!("\t\tiifname {sbx} jump sandbox_to_host\n\t}}\n");
        s += "\tchain sandbox_to_host {\n";
        if !self.resolvers.is_empty() {
            s += &format!(
                "\t\tip daddr {} meta l4proto {{ tcp, udp }} th dport 53 accept\n",
                set_of(&self.resolvers)
            );
        }
        s += "\t\tcounter name \"to_host\" drop\n\t}\n";
        s += "\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n";
        s += &format!(
            "\t\tip saddr {} oifname != {sbx} masquerade\n\t}}\n",
            self.subnet
        );
        s += "}\n";
        s
    }
}

impl Policy {
    /// The IPv4 deny list: built-in, the sandbox subnet, the host's
    /// networks and addresses, the operator's `deny`.
    pub fn deny4(&self) -> Vec<String> {
        let mut d: Vec<String> = DENY4.iter().map(|s| s.to_string()).collect();
        d.push(self.subnet.to_string());
        d.extend(self.host_nets.iter().map(|c| c.to_string()));
        d.extend(self.deny.iter().map(|c| c.to_string()));
        d
    }

    /// The accept rules of DNS to the resolvers and of the operator's
    /// holes, each line starting with `indent` and ending in `verdict`.
    fn holes(&self, indent: &str, verdict: &str) -> String {
        let mut s = String::new();
        if !self.resolvers.is_empty() {
            s += &format!(
                "{indent}ip daddr {} meta l4proto {{ tcp, udp }} th dport 53 {verdict}\n",
                set_of(&self.resolvers)
            );
        }
        for h in &self.allow {
            match h.port {
                Some(p) => {
                    s += &format!(
                        "{indent}ip daddr {} meta l4proto {{ tcp, udp }} th dport {p} {verdict}\n",
                        h.cidr
                    )
                }
                None => s += &format!("{indent}ip daddr {} {verdict}\n", h.cidr),
            }
        }
        s
    }

    /// The table loaded inside every sandbox's own network namespace
    /// before its veth exists: the same deny list on the `output` hook, so
    /// that the sandbox's traffic is dropped even while the host's table is
    /// missing (deleted, flushed by a firewall reload, replaced). A host
    /// flush never reaches it, and the sandbox has no CAP_NET_ADMIN over its
    /// namespace to change it. Loopback passes (the agent listens there);
    /// IPv6 is dropped; DNS to the resolvers and the operator's holes pass;
    /// the deny list (the sandbox subnet, hence the host end and every
    /// sibling, and the host's networks and addresses) is dropped.
    pub fn render_sandbox_side(&self) -> String {
        let t = &self.table;
        let mut s = String::new();
        s += &format!("table inet {t} {{\n");
        s += &format!(
            "\tset deny4 {{\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\tauto-merge\n\t\telements = {{ {} }}\n\t}}\n",
            self.deny4().join(", ")
        );
        s += "\tchain output {\n\t\ttype filter hook output priority filter; policy accept;\n";
        s += "\t\toifname \"lo\" accept\n";
        s += "\t\tmeta nfproto ipv6 drop\n";
        s += &self.holes("\t\t", "accept");
        s += "\t\tip daddr @deny4 drop\n";
        s += "\t}\n}\n";
        s
    }
}

/// The stdout of a finished `nft`, or its stderr as the error.
fn checked(out: std::process::Output) -> Result<Vec<u8>, NftError> {
    if !out.status.success() {
        return Err(NftError::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(out.stdout)
}

impl Nft {
    /// Runs an nft script (one transaction).
    pub fn run(&self, script: &str) -> Result<(), NftError> {
        self.run_with(script, None, |_| ())
    }

    /// Runs an nft script (one transaction) in the network namespace
    /// `netns` (the child joins it before it runs `nft`; the daemon's
    /// threads never change namespace for it).
    pub fn run_in(&self, script: &str, netns: BorrowedFd<'_>) -> Result<(), NftError> {
        self.run_with(script, Some(netns.as_raw_fd()), |_| ())
    }

    /// Runs an nft script, telling `spawned` the PID of the `nft` before
    /// it reads its script (so that its transaction can be recognised).
    pub fn run_recorded(&self, script: &str, spawned: impl FnOnce(u32)) -> Result<(), NftError> {
        self.run_with(script, None, spawned)
    }

    fn run_with(
        &self,
        script: &str,
        netns: Option<RawFd>,
        spawned: impl FnOnce(u32),
    ) -> Result<(), NftError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(fd) = netns {
            // SAFETY: between fork and exec the child only calls setns, an
            // async-signal-safe system call, on an fd the parent keeps open.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().map_err(|e| self.spawn_error(e))?;
        spawned(child.id());
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| self.spawn_error(e))?;
        }
        let out = child.wait_with_output().map_err(|e| self.spawn_error(e))?;
        checked(out).map(drop)
    }

    /// `nft -j list <what>`, parsed.
    pub fn list_json(&self, what: &[&str]) -> Result<serde_json::Value, NftError> {
        let out = Command::new(&self.program)
            .arg("-j")
            .arg("list")
            .args(what)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.spawn_error(e))?;
        let stdout = checked(out)?;
        serde_json::from_slice(&stdout).map_err(|e| NftError::Failed(e.to_string()))
    }

    fn spawn_error(&self, source: std::io::Error) -> NftError {
        NftError::Spawn {
            nft: self.program.clone(),
            source,
        }
    }

    /// The elements of the `sandboxes` set: (link, address).
    pub fn sandbox_elements(&self, table: &str) -> Result<Vec<(String, String)>, NftError> {
        let v = self.list_json(&["set", "inet", table, "sandboxes"])?;
        let mut out = Vec::new();
        for o in v["nftables"].as_array().into_iter().flatten() {
            for e in o["set"]["elem"].as_array().into_iter().flatten() {
                let c = &e["concat"];
                if let (Some(l), Some(a)) = (c[0].as_str(), c[1].as_str()) {
                    out.push((l.to_string(), a.to_string()));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_holes_before_the_deny_list() {
        let p = Policy {
            table: "sandboxd".into(),
            link_prefix: "sbx-".into(),
            subnet: "10.243.0.0/16".parse().unwrap(),
            allow: vec![
                "10.1.2.3/32:3306".parse().unwrap(),
                "10.9.0.0/16".parse().unwrap(),
            ],
            deny: vec!["198.18.0.0/15".parse().unwrap()],
            max_connections: 512,
            resolvers: vec!["10.0.0.2".parse().unwrap()],
            host_nets: vec!["203.0.113.0/30".parse().unwrap()],
        };
        let s = p.render(&[element("sbx-0", "10.243.0.1".parse().unwrap())]);
        let hole = s.find("ip daddr 10.1.2.3/32 meta l4proto").unwrap();
        let all = s.find("ip daddr 10.9.0.0/16 accept").unwrap();
        let deny = s.find("ip daddr @deny4").unwrap();
        assert!(hole < deny && all < deny, "{s}");
        assert!(
            s.contains("10.243.0.0/16, 203.0.113.0/30, 198.18.0.0/15"),
            "{s}"
        );
        // Stateless: no `established` accept before the deny list.
        let chain = s.find("chain from_sandbox").unwrap();
        assert!(!s[chain..deny].contains("established"), "{s}");
        // The connection cap before any accept.
        let cap = s.find("ct count over").unwrap();
        assert!(chain < cap && cap < hole, "{s}");
        let inner = p.render_sandbox_side();
        let lo = inner.find("oifname \"lo\" accept").unwrap();
        let hole = inner.find("ip daddr 10.1.2.3/32 meta l4proto").unwrap();
        let deny = inner.find("ip daddr @deny4 drop").unwrap();
        assert!(lo < hole && hole < deny, "{inner}");
        assert!(inner.contains("203.0.113.0/30"), "{inner}");
        assert!(!inner.contains("delete"), "{inner}");
        assert!(s.contains("elements = { \"sbx-0\" . 10.243.0.1 }"), "{s}");
        assert!(s.contains("ip daddr 10.0.0.2 meta l4proto { tcp, udp } th dport 53 accept"));
        assert!(s.contains("ct count over 512"));
        assert!(s.contains("ip saddr 10.243.0.0/16 oifname != \"sbx-*\" masquerade"));
    }
}
