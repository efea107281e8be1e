#!/usr/bin/env bash
# Density benchmark: BENCH_DENSITY (500) idle sandboxes on one daemon
# (default configuration), see run_density in bench/create.rs. Needs root
# and memory (a few MiB per sandbox). Writes docs/performance.md.
#
#   bash bench/density.sh
#   BENCH_DENSITY=100 BENCH_IDLE_SECONDS=10 bash bench/density.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH_ONLY=density cargo bench --bench create
