//! The NetworkPolicy of a sandbox Pod: ingress only from the daemon's Pods
//! (and configured CIDRs) to the agent's port; egress to the internet but
//! not to private, link-local/metadata, loopback, multicast or reserved
//! ranges nor the cluster's own CIDRs, holes from `egress_allow`, DNS only
//! to the cluster DNS Pods. Pure: the settings are parsed once at start
//! ([`NetPolicyConfig::from_config`]) and the object built per sandbox.
//!
//! The names and the `CIDR[:port[/proto]]` form are those the native
//! backend's `[network] allow`/`deny` will use.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names;
use crate::backend::kube_config::KubeConfig;

/// Denied to sandboxes whatever the configuration says (unless an
/// `egress_allow` entry opens a hole): private (RFC 1918), shared address
/// space (CGNAT, RFC 6598), link-local (cloud metadata at 169.254.169.254),
/// loopback, "this network", multicast and reserved.
pub const DENY_V4: [&str; 9] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
    "0.0.0.0/8",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
/// The IPv6 equivalents: unique local, link-local, loopback, multicast,
/// and the NAT64 prefixes (RFC 6052, RFC 8215), through which a cluster
/// with a NAT64 gateway reaches IPv4 addresses, the private ones included.
pub const DENY_V6: [&str; 6] = [
    "fc00::/7",
    "fe80::/10",
    "::1/128",
    "ff00::/8",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
];

/// An IP network in CIDR notation, host bits clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (address/prefix)"))?;
        let addr: IpAddr = a.parse().map_err(|e| format!("{s:?} is not a CIDR: {e}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{s:?}: the prefix must be 0..={max}"))?;
        let bits: u128 = match addr {
            IpAddr::V4(v) => u128::from(u32::from(v)),
            IpAddr::V6(v) => u128::from(v),
        };
        let host_mask: u128 = match (addr.is_ipv4(), prefix) {
            (true, 32) | (false, 128) => 0,
            (true, p) => (1u128 << (32 - u32::from(p))) - 1,
            (false, p) => u128::MAX >> p,
        };
        let host = bits & host_mask;
        if host != 0 {
            return Err(format!("{s:?} has host bits set"));
        }
        Ok(Cidr { addr, prefix })
    }

    pub fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One `egress_allow` entry: `CIDR`, `CIDR:PORT` or `CIDR:PORT/udp`
/// (`/tcp` is the default protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hole {
    pub cidr: Cidr,
    pub port: Option<(u16, &'static str)>,
}

impl Hole {
    pub fn parse(s: &str) -> Result<Hole, String> {
        let slash = s
            .find('/')
            .ok_or_else(|| format!("{s:?} is not CIDR[:port[/tcp|udp]]"))?;
        let after = &s[slash + 1..];
        let (cidr, port) = match after.split_once(':') {
            Some((prefix, port)) => (format!("{}/{prefix}", &s[..slash]), Some(port)),
            None => (s.to_string(), None),
        };
        let cidr = Cidr::parse(&cidr)?;
        let port = match port {
            None => None,
            Some(p) => {
                let (num, proto) = match p.split_once('/') {
                    Some((n, "tcp")) => (n, "TCP"),
                    Some((n, "udp")) => (n, "UDP"),
                    Some(_) => return Err(format!("{s:?}: the protocol must be tcp or udp")),
                    None => (p, "TCP"),
                };
                let n: u16 = num
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{s:?}: bad port {num:?}"))?;
                Some((n, proto))
            }
        };
        Ok(Hole { cidr, port })
    }
}

/// The parsed `[kubernetes]` network settings.
#[derive(Debug, Clone)]
pub struct NetPolicyConfig {
    pub ingress_pod_labels: BTreeMap<String, String>,
    pub ingress_namespace_labels: BTreeMap<String, String>,
    pub ingress_cidrs: Vec<Cidr>,
    pub allow: Vec<Hole>,
    /// The built-in list, then `cluster_cidrs`, then `egress_deny`.
    pub deny: Vec<Cidr>,
    pub dns_pod_labels: BTreeMap<String, String>,
    pub dns_namespace_labels: BTreeMap<String, String>,
}

fn parse_all<T>(
    key: &str,
    items: &[String],
    f: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    items
        .iter()
        .map(|s| f(s).map_err(|e| format!("kubernetes.{key}: {e}")))
        .collect()
}

impl NetPolicyConfig {
    pub fn from_config(k: &KubeConfig) -> Result<NetPolicyConfig, String> {
        let mut deny: Vec<Cidr> = DENY_V4
            .iter()
            .chain(DENY_V6.iter())
            .map(|s| Cidr::parse(s).expect("built-in CIDR"))
            .collect();
        deny.extend(parse_all("cluster_cidrs", &k.cluster_cidrs, Cidr::parse)?);
        deny.extend(parse_all("egress_deny", &k.egress_deny, Cidr::parse)?);
        if k.ingress_pod_labels.is_empty() && k.ingress_namespace_labels.is_empty() {
            return Err(
                "kubernetes.ingress_pod_labels and ingress_namespace_labels are both empty: \
                 that would admit every Pod of the cluster"
                    .into(),
            );
        }
        Ok(NetPolicyConfig {
            ingress_pod_labels: k.ingress_pod_labels.clone(),
            ingress_namespace_labels: k.ingress_namespace_labels.clone(),
            ingress_cidrs: parse_all("ingress_cidrs", &k.ingress_cidrs, Cidr::parse)?,
            allow: parse_all("egress_allow", &k.egress_allow, Hole::parse)?,
            deny,
            dns_pod_labels: k.dns_pod_labels.clone(),
            dns_namespace_labels: k.dns_namespace_labels.clone(),
        })
    }
}

fn selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        match_expressions: None,
    }
}

fn port(protocol: &str, port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(port)),
        end_port: None,
    }
}

fn block(cidr: &str, except: Vec<String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.into(),
            except: (!except.is_empty()).then_some(except),
        }),
        ..Default::default()
    }
}

/// The NetworkPolicy of one sandbox incarnation, owned by its Pod.
pub fn build_network_policy(
    sandbox_id: &str,
    pod_uid: &str,
    namespace: &str,
    container_port: u16,
    c: &NetPolicyConfig,
) -> NetworkPolicy {
    let mut from = vec![NetworkPolicyPeer {
        namespace_selector: Some(selector(&c.ingress_namespace_labels)),
        pod_selector: Some(selector(&c.ingress_pod_labels)),
        ip_block: None,
    }];
    from.extend(
        c.ingress_cidrs
            .iter()
            .map(|x| block(&x.to_string(), vec![])),
    );
    let (v4, v6): (Vec<&Cidr>, Vec<&Cidr>) = c.deny.iter().partition(|x| x.is_v4());
    let strings = |v: Vec<&Cidr>| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut egress = vec![
        NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(selector(&c.dns_namespace_labels)),
                pod_selector: Some(selector(&c.dns_pod_labels)),
                ip_block: None,
            }]),
            ports: Some(vec![port("UDP", 53), port("TCP", 53)]),
        },
        NetworkPolicyEgressRule {
            to: Some(vec![
                block("0.0.0.0/0", strings(v4)),
                block("::/0", strings(v6)),
            ]),
            ports: None,
        },
    ];
    egress.extend(c.allow.iter().map(|h| NetworkPolicyEgressRule {
        to: Some(vec![block(&h.cidr.to_string(), vec![])]),
        ports: h.port.map(|(n, proto)| vec![port(proto, i32::from(n))]),
    }));
    NetworkPolicy {
        metadata: names::pod_owned_metadata(sandbox_id, namespace, pod_uid),
        spec: Some(NetworkPolicySpec {
            pod_selector: selector(&names::pod_selector_labels(sandbox_id)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![port("TCP", i32::from(container_port))]),
            }]),
            egress: Some(egress),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(Cidr::parse("::1/128").unwrap().to_string(), "::1/128");
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().prefix, 0);
        assert!(Cidr::parse("10.0.0.1/8").unwrap_err().contains("host bits"));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("10.0.0.0").is_err());
        assert!(Cidr::parse("fd00::1/64").is_err());
        assert!(Cidr::parse("1.2.3.4/32").is_ok());
        for s in DENY_V4.iter().chain(DENY_V6.iter()) {
            Cidr::parse(s).unwrap();
        }
    }

    #[test]
    fn holes() {
        let h = Hole::parse("10.1.2.3/32:3306").unwrap();
        assert_eq!(h.cidr.to_string(), "10.1.2.3/32");
        assert_eq!(h.port, Some((3306, "TCP")));
        assert_eq!(Hole::parse("10.9.0.0/16").unwrap().port, None);
        assert_eq!(
            Hole::parse("fd00::/64:53/udp").unwrap().port,
            Some((53, "UDP"))
        );
        assert_eq!(Hole::parse("fd00::/64").unwrap().cidr.prefix, 64);
        assert!(Hole::parse("10.0.0.0/8:0").is_err());
        assert!(Hole::parse("10.0.0.0/8:80/sctp").is_err());
        assert!(Hole::parse("10.0.0.0:80").is_err());
    }

    #[test]
    fn bad_settings_are_named() {
        let mut k = KubeConfig {
            egress_allow: vec!["nope".into()],
            ..KubeConfig::default()
        };
        let e = NetPolicyConfig::from_config(&k).unwrap_err();
        assert!(e.starts_with("kubernetes.egress_allow: "), "{e}");
        k.egress_allow.clear();
        k.ingress_pod_labels.clear();
        k.ingress_namespace_labels.clear();
        assert!(NetPolicyConfig::from_config(&k).is_err());
    }
}
