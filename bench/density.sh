#!/usr/bin/env bash
# Density benchmark: BENCH_DENSITY (500) idle sandboxes on one daemon
# (default configuration), see run_density in bench/create.rs. Needs root
# and memory (a few MiB per sandbox). Writes docs/performance.md.
#
#   bash bench/density.sh
#   BENCH_DENSITY=100 BENCH_IDLE_SECONDS=10 bash bench/density.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The daemon's default network mode (egress) runs `nft` for its policy.
if ! command -v nft >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null
fi
# The daemon runs the launcher next to it (target/release/sandbox-init),
# which `cargo bench` does not build.
cargo build --release -p sandbox-init
BENCH_ONLY=density cargo bench --bench create
