#!/usr/bin/env bash
# Create/delete benchmark of native sandboxes vs `runc run` of the same
# bundle (see bench/create.rs). Needs root. Writes docs/performance.md.
#
#   bash bench/create.sh            # 30 sandboxes per network mode
#   BENCH_N=20 bash bench/create.sh
#
# SANDBOXD_NETWORK_TABLE, SANDBOXD_NETWORK_LINK_PREFIX,
# SANDBOXD_NETWORK_SUBNET and SANDBOXD_CGROUP_PARENT, when set, replace the
# bench's own (sandboxd_bench, sbxbn-, 10.252.0.0/16, sandboxd-bench), so a
# second bench can run beside another one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The daemon's default network mode (egress) runs `nft` for its policy.
if ! command -v nft >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null
fi
if ! command -v runc >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
fi
# The daemon runs the launcher next to it (target/release/sandbox-init),
# which `cargo bench` does not build.
cargo build --release -p sandbox-init
cargo bench --bench create
