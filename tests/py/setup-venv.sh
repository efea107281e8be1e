#!/usr/bin/env bash
# Creates the Python venv used by tests/agent_client.rs and installs the
# published client the platform backends use (agent-sandbox, PyPI), and
# schemathesis (PyPI) for the API fuzz tests (tests/it/fuzz_api.rs).
#
#   tests/py/setup-venv.sh            # venv at <repo>/target/test-venv
#   SANDBOXD_TEST_VENV=/x tests/py/setup-venv.sh
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${SANDBOXD_TEST_VENV:-$repo/target/test-venv}"
client_version="0.0.30"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "agent-sandbox==$client_version"
"$venv/bin/python" -c 'import agent_sandbox, importlib.metadata as m; print("agent-sandbox", m.version("agent-sandbox"), "in", "'"$venv"'")'

# schemathesis: the API fuzz tests (tests/it/fuzz_api.rs) run its CLI
# against a daemon, with the OpenAPI document it serves.
schemathesis_version="4.32.5"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "schemathesis==$schemathesis_version"
"$venv/bin/schemathesis" --version
