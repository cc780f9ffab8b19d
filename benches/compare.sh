#!/usr/bin/env bash
# bramble and nanobot side by side (issue 17): the same CLI turn with one exec
# call against the same zero-latency fake LLM, and the idle daemon. Figures
# go to BENCHMARKS.md ("Side by side with nanobot").
#
#   benches/compare.sh [RUNS=20] [IDLE_SECONDS=60]
#
# Builds bramble (`cargo build --release`, or BRAMBLE_BIN), makes a venv with
# nanobot-ai 0.3.5 from PyPI under target/compare/ (kept for the next run),
# starts benches/compare/fake_llm.py on a free port, runs
# benches/compare/measure.py. Not part of CI: it downloads nanobot and takes
# a few minutes. It also records the first request of the turn (bramble with
# the default and the lean profile, nanobot) and prints its size in tokens
# (characters / 4), tool count and bytes of tool schemas (issue 43).
# COMPARE_ONLY=prompt: the first-prompt table only. NANOBOT=-: without nanobot
# (where it cannot be installed; issue 43 measured ≈ 8,200 tokens for it).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
idle=${2:-60}
dir=${COMPARE_DIR:-target/compare}
mkdir -p "$dir"
bin=${BRAMBLE_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --quiet
    bin=target/release/bramble
fi
nanobot=${NANOBOT:-$dir/venv/bin/nanobot}
if [ "$nanobot" != "-" ] && [ ! -x "$nanobot" ]; then
    echo "== making $dir/venv with nanobot-ai 0.3.5" >&2
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install --quiet nanobot-ai==0.3.5
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 benches/compare/fake_llm.py "$port" &
fake=$!
trap 'kill $fake 2>/dev/null' EXIT
sleep 0.5
echo "== bramble $("$bin" --version | head -1) vs nanobot 0.3.5 ($(nproc) cores, $(uname -m))" >&2
[ "$nanobot" = "-" ] || nanobot=$(realpath "$nanobot")
python3 benches/compare/measure.py "$(realpath "$bin")" "$nanobot" "$port" "$runs" "$idle"
