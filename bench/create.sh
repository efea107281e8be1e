#!/usr/bin/env bash
# Create/delete benchmark of native sandboxes vs `runc run` of the same
# bundle (see bench/create.rs). Needs root. Writes docs/performance.md.
#
#   bash bench/create.sh            # 30 sandboxes per network mode
#   BENCH_N=20 bash bench/create.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v runc >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
fi
# The daemon runs the launcher next to it (target/release/sandbox-init),
# which `cargo bench` does not build.
cargo build --release -p sandbox-init
cargo bench --bench create
