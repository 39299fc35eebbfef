#!/usr/bin/env bash
# The scale benchmark (issue 12): meshpilot against the physical limit (a replay of what it
# sent), istiod and split meshpilot (ingest + frontends behind an Envoy hashing LB), on one
# generated mesh, driven by `meshpilot load`. Not a test: a tool to run by hand.
#
#   bash scripts/bench.sh                 # 1,000 services x 10 endpoints, 1,000 proxies
#   bash scripts/bench.sh --services 50 --proxies 20 --targets meshpilot,istiod
#   bash scripts/bench.sh chart           # 1k/2k/5k/10k proxies -> docs/bench/scale.{json,svg}
#   bash scripts/bench.sh --help
#
# The work is done by standard-library Python 3 in scripts/bench/ (see docs/benchmark.md).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "bench: python3 is required" >&2; exit 1; }
PYTHONDONTWRITEBYTECODE=1 exec python3 scripts/bench/main.py "$@"
