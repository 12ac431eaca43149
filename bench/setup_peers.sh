#!/usr/bin/env bash
# Creates .venv-bench (git-ignored) with the benchmark peers, pinned in bench/requirements-peers.lock:
# the LiteLLM proxy, vllm-router, py-spy, and mypy (bench/mypyc_tree.py). Kept apart from .venv so
# the peers can never change a package pinned in requirements.lock.
#
# litellm[proxy] cannot be installed from the registry (its extra pins `litellm-proxy`, which is absent,
# and litellm 1.110.2's `litellm-proxy-extras==0.4.114.post1` is not published); the proxy code ships in
# the litellm wheel, so the lock lists the extra's other dependencies (with litellm-proxy-extras 0.4.110)
# and pip installs them with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
test -x .venv-bench/bin/python || "$PYTHON" -m venv .venv-bench
.venv-bench/bin/pip install -q --upgrade pip
.venv-bench/bin/pip install -q --no-deps -r bench/requirements-peers.lock
.venv-bench/bin/python -c "import litellm, psutil, httpx" && echo "peers ready in .venv-bench"
