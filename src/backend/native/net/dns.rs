//! The resolvers a sandbox is given: the host's non-loopback IPv4
//! nameservers; when the host runs a loopback stub (systemd-resolved's
//! 127.0.0.53), the upstream list systemd-resolved keeps, as Docker does.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

/// systemd-resolved's list of upstream servers.
pub const SYSTEMD_UPSTREAM: &str = "/run/systemd/resolve/resolv.conf";

/// The `nameserver` and `search` lines of a resolv.conf.
fn parse(text: &str) -> (Vec<IpAddr>, Vec<String>) {
    let mut ns = Vec::new();
    let mut search = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("nameserver") => {
                if let Some(ip) = w.next().and_then(|a| a.split('%').next()?.parse().ok()) {
                    ns.push(ip);
                }
            }
            Some("search") | Some("domain") => {
                search = w.map(str::to_string).collect();
            }
            _ => {}
        }
    }
    (ns, search)
}

/// The resolvers (and search domains) from the host's resolv.conf text and,
/// when that names a loopback resolver, from `upstream` (systemd-resolved's
/// list, if readable). Only IPv4 non-loopback, non-unspecified addresses.
pub fn pick(host: &str, upstream: Option<&str>) -> (Vec<Ipv4Addr>, Vec<String>) {
    let (ns, search) = parse(host);
    let (ns, search) = if ns.iter().any(|ip| ip.is_loopback()) {
        match upstream {
            Some(u) => parse(u),
            None => (ns, search),
        }
    } else {
        (ns, search)
    };
    let v4 = ns
        .into_iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v) if !v.is_loopback() && !v.is_unspecified() => Some(v),
            _ => None,
        })
        .collect();
    (v4, search)
}

/// Reads `resolv_conf` (and systemd-resolved's upstream list if needed).
pub fn host_resolvers(resolv_conf: &Path) -> (Vec<Ipv4Addr>, Vec<String>) {
    let host = std::fs::read_to_string(resolv_conf).unwrap_or_default();
    let upstream = std::fs::read_to_string(SYSTEMD_UPSTREAM).ok();
    pick(&host, upstream.as_deref())
}

/// The sandbox's `/etc/resolv.conf`.
pub fn render(resolvers: &[Ipv4Addr], search: &[String]) -> String {
    let mut s = String::from("# sandboxd: the host's resolvers reachable from this sandbox\n");
    if resolvers.is_empty() {
        s.push_str("# (none usable on this host)\n");
    }
    for r in resolvers.iter().take(3) {
        s.push_str(&format!("nameserver {r}\n"));
    }
    if !search.is_empty() {
        s.push_str(&format!("search {}\n", search.join(" ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_stub_uses_the_upstream_list() {
        let host = "nameserver 127.0.0.53\noptions edns0\nsearch corp.example\n";
        let up = "nameserver 10.0.0.2\nnameserver fd00::1\nsearch corp.example\n";
        let (ns, search) = pick(host, Some(up));
        assert_eq!(ns, vec!["10.0.0.2".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(search, vec!["corp.example"]);
        // No upstream list: nothing usable.
        assert!(pick(host, None).0.is_empty());
        // A plain host keeps its own, minus loopback and IPv6.
        let (ns, _) = pick("nameserver 1.1.1.1\nnameserver ::1\n", Some(up));
        assert_eq!(ns, vec!["10.0.0.2".parse::<Ipv4Addr>().unwrap()]);
        let (ns, _) = pick("nameserver 1.1.1.1\nnameserver 9.9.9.9\n", Some(up));
        assert_eq!(ns.len(), 2);
        assert!(render(&[], &[]).contains("none usable"));
    }
}
