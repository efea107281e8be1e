//! The `[network]` section.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::NetworkMode;

/// Sandbox networking (`[network]`, see `docs/network.md`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// `egress` (default): a veth, NAT and the egress policy; `none`:
    /// loopback only.
    pub mode: NetworkMode,
    /// The pool every sandbox's address comes from (a /31 each).
    pub subnet: String,
    /// Holes in the deny list: `CIDR` or `CIDR:port` (TCP and UDP).
    pub allow: Vec<String>,
    /// More denied destinations (CIDRs), on top of the built-in list.
    pub deny: Vec<String>,
    /// Concurrent connections one sandbox may have (`ct count`).
    pub max_connections: u32,
    /// The host's resolver configuration the sandboxes' resolvers come
    /// from (a loopback stub sends us to systemd-resolved's upstream list).
    pub resolv_conf: PathBuf,
    /// The nftables table (family `inet`) the daemon owns.
    pub table: String,
    /// The prefix of the host ends of the sandboxes' veths. Two daemons on
    /// one host (tests) need their own table, prefix and subnet.
    pub link_prefix: String,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            mode: NetworkMode::Egress,
            subnet: "10.243.0.0/16".to_string(),
            allow: Vec::new(),
            deny: Vec::new(),
            max_connections: 512,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            table: "sandboxd".to_string(),
            link_prefix: "sbx-".to_string(),
        }
    }
}
