#!/usr/bin/env bash
# Install vLLM 0.33.0 for the CPU (its scheduler is all kvreplay's tests need) into a cached
# venv and print that venv's python. Reused when present; every pip call is time-bounded.
#
#   py=$(bash .ci/install_vllm.sh)           # then: KVREPLAY_VLLM_PYTHON=$py pytest ...
#
# Venv: $KVREPLAY_VLLM_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/kvreplay/vllm-0.33.
# torch is the CPU build 2.13.0 that pip finds on this machine's disk (never a CUDA build:
# checked below); vLLM itself goes in with --no-deps, its dependencies pinned by
# tools/oracle/harness/requirements-oracle.txt (vLLM 0.33.0 pins torch 2.14.0; the scheduler
# uses torch only as a dtype label, so 2.13 works).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVREPLAY_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvreplay/vllm-0.33}
REQ=$REPO/tools/oracle/harness/requirements-oracle.txt
VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
STAMP=$VENV/.kvreplay-install
want="vllm=$VLLM_VERSION torch=$TORCH_VERSION req=$(sha256sum "$REQ" | cut -c1-16)"
PIP_TIMEOUT=${KVREPLAY_VLLM_PIP_TIMEOUT:-900}

check() {
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, sys
import torch
assert torch.version.cuda is None, f"CUDA torch {torch.__version__} in the vLLM venv"
assert not [d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").startswith("nvidia-")]
assert md.version("vllm") == "0.33.0", md.version("vllm")
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]] && check >/dev/null 2>&1; then
    echo "install_vllm: reusing $VENV" >&2
    echo "$VENV/bin/python"
    exit 0
fi

t0=$(date +%s)
PY=$(command -v python3.11 || command -v python3)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
pip() { timeout "$PIP_TIMEOUT" "$VENV/bin/pip" --disable-pip-version-check -q "$@" >&2; }
pip install "torch==$TORCH_VERSION"
pip install --no-deps -r "$REQ"
pip install --no-deps "vllm==$VLLM_VERSION"
check >&2
echo "$want" > "$STAMP"
echo "install_vllm: installed vLLM $VLLM_VERSION (CPU torch $TORCH_VERSION) in $VENV in $(( $(date +%s) - t0 ))s" >&2
echo "$VENV/bin/python"
