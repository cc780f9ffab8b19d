#!/usr/bin/env bash
# The small boards' figures for one build, under qemu-user on this machine:
#
#   cross/measure.sh BIN [QEMU...]     # e.g. cross/measure.sh target-cross/arm-…/bramble qemu-arm-static -cpu arm1176
#
# Prints: the binary's size; `--version` wall time (median of 5); one
# `bramble agent -m` turn with an exec call against .ci/fake-openai.py (median
# of 3); and the idle daemon's memory 30 s after start (`bramble run`, no
# channels, heartbeat off). qemu translates every instruction, so the times
# are this machine's emulation of the board, not the board's; they compare
# the builds with one another, no more.
#
# The memory figure is the guest's own: qemu runs it at guest_base (-B) in a
# range of its own, and only the resident pages of the mappings in that range
# are counted (the binary's pages, heap, stacks); qemu's own memory and its
# translated code are not. It is still not the board's RSS: under qemu-user
# the daemon cannot drop the start-up code pages (src/util/sys.rs), so it
# counts some 1-3 MB of code a board's idle daemon has given back.
#
# MEASURE_CHANNELS=1: the idle daemon runs with Telegram and MQTT configured
# (the slim build's goal, issue 44): a fake Bot API on 127.0.0.1 (Python:
# getMe, deleteWebhook, setMyCommands, and getUpdates held 50 s and answered
# with no updates, as https://core.telegram.org/bots/api describes) and a real
# mosquitto of its own (Debian's /usr/sbin/mosquitto).
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:?usage: $0 BIN [QEMU...]}"
shift
runner=("$@")
work=$(mktemp -d)
fake="" daemon="" tg="" broker=""
cleanup() {
    [ -z "$daemon" ] || kill "$daemon" 2>/dev/null || true
    [ -z "$tg" ] || kill "$tg" 2>/dev/null || true
    [ -z "$broker" ] || kill "$broker" 2>/dev/null || true
    [ -z "$fake" ] || kill "$fake" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# guest_base for qemu: 1 TiB, the guest's addresses live in [1 TiB, 2 TiB).
base=$((1 << 40))
run() {
    if [ "${#runner[@]}" = 0 ]; then "$bin" "$@"; else "${runner[@]}" -B "$(printf '0x%x' "$base")" "$bin" "$@"; fi
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(((t1 - t0) / 1000000)); }

echo "binary: $bin ($(stat -c %s "$bin") B; $(file -b "$bin" | cut -d, -f1-2))"
echo "runner: ${runner[*]:-native}"
echo "--version: $(run --version)"
v=$(for _ in 1 2 3 4 5; do ms run --version; done | median)
echo "--version wall, median of 5: $v ms"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 .ci/fake-openai.py "$port" "$work/llm.jsonl" &
fake=$!
for _ in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null && break; sleep 0.2; done
mkdir -p "$work/home" "$work/workspace"
cat >"$work/config.toml" <<EOF
[agent]
model = "smoke-model"
workspace = "$work/workspace"
timezone = "UTC"

[provider]
kind = "openai"
base_url = "http://127.0.0.1:$port/v1"

[heartbeat]
enabled = false

[daemon]
state_dir = "$work/state"
clock_sync_wait = "0s"

# Under qemu-user the sandbox helper (a foreign binary) cannot start.
[exec]
isolation = "off"
EOF
export HOME="$work/home" OPENAI_API_KEY=measure-key
out=$(run --config "$work/config.toml" agent -m 'SMOKE-EXEC echo $((40+2))')
grep -q "tool said: .*42" <<<"$out" || { echo "error: the turn did not run the exec call: $out" >&2; exit 1; }
t=$(for _ in 1 2 3; do ms run --config "$work/config.toml" agent -m 'SMOKE-EXEC echo $((40+2))'; done | median)
echo "agent -m turn with an exec call, wall, median of 3: $t ms"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if [ "${MEASURE_CHANNELS:-0}" = 1 ]; then
    tg_port=$(free_port)
    python3 - "$tg_port" <<'PY' &
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Bot(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        method = self.path.rsplit("/", 1)[-1]
        if method == "getUpdates":
            time.sleep(50)
        me = {"id": 42, "is_bot": True, "first_name": "m", "username": "measure_bot"}
        result = me if method == "getMe" else [] if method == "getUpdates" else True
        body = json.dumps({"ok": True, "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Bot).serve_forever()
PY
    tg=$!
    mqtt_port=$(free_port)
    printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$mqtt_port" >"$work/mosquitto.conf"
    mosquitto=$(command -v mosquitto || echo /usr/sbin/mosquitto)
    "$mosquitto" -c "$work/mosquitto.conf" >"$work/mosquitto.log" 2>&1 &
    broker=$!
    cat >>"$work/config.toml" <<EOF

[telegram]
token = "42:measure"
allow_from = ["1"]
api_base = "http://127.0.0.1:$tg_port"

[mqtt]
url = "mqtt://127.0.0.1:$mqtt_port"
device = "measure"
EOF
    sleep 1
fi

# Started directly (not through run()): $! must be the emulator's own pid.
if [ "${#runner[@]}" = 0 ]; then
    "$bin" --config "$work/config.toml" run >"$work/daemon.log" 2>&1 &
else
    "${runner[@]}" -B "$(printf '0x%x' "$base")" "$bin" --config "$work/config.toml" run >"$work/daemon.log" 2>&1 &
fi
daemon=$!
sleep 30
kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.log" >&2; echo "error: the daemon exited" >&2; exit 1; }
if [ "${#runner[@]}" = 0 ]; then
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$daemon/status")
    echo "idle daemon RSS after 30 s: $rss KiB"
else
    guest=$(python3 - "$daemon" "$base" <<'PY'
import re, sys
pid, lo = sys.argv[1], int(sys.argv[2])
total, inside = 0, False
for line in open(f"/proc/{pid}/smaps"):
    m = re.match(r"([0-9a-f]+)-[0-9a-f]+ ", line)
    if m:
        inside = lo <= int(m.group(1), 16) < 2 * lo
    elif line.startswith("Rss:") and inside:
        total += int(line.split()[1])
print(total)
PY
)
    total=$(awk '/^VmRSS/ {print $2}' "/proc/$daemon/status")
    echo "idle daemon after 30 s: guest pages $guest KiB (qemu process in all: $total KiB)"
fi
if [ "${MEASURE_CHANNELS:-0}" = 1 ]; then
    # Both must have connected, or the figure is not the one asked for.
    grep -iE 'telegram|mqtt' "$work/daemon.log" | tail -4
    grep -qiE 'mqtt.*connected|connected.*mqtt' "$work/daemon.log" || echo "warning: no MQTT connection in the daemon's log" >&2
fi
