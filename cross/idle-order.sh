#!/usr/bin/env bash
# Lay out the idle daemon's code together (issue 17, idle RSS): writes
# cross/idle-order.ld, which build.rs gives the linker in release builds.
#
#   cross/idle-order.sh [IDLE_SECONDS=330]
#
# An idle daemon runs little code (a Telegram long poll every 50 s, the MQTT
# ping, the scheduler's and the dead-man's wake-ups), but scattered over the
# binary: every page it touches stays resident with its neighbours (the
# kernel faults in 64 KiB around each miss). This script finds that code and
# names it for the linker, which then places it first, in a few dozen pages:
#
# 1. builds an unstripped release binary (its own CARGO_TARGET_DIR);
# 2. runs the telegram bench's idle part (Telegram + MQTT + 100 jobs, a real
#    mosquitto) with the daemon under valgrind's callgrind, zeroes the counts
#    once start-up is over (READY; so the release of the start-up pages 20 s
#    later is in) and dumps them IDLE_SECONDS later (330: one MQTT ping and
#    one 5-minute grid wake-up are in);
# 3. writes one input-section pattern per function that ran, without the
#    legacy mangling's hash (`17h<16 hex>E`), so that the file survives
#    rebuilds and compiler updates (a function renamed since simply falls
#    back to the default layout), plus the TLS record layer, which the
#    bench's plain-HTTP fake does not run.
#
# Needs valgrind and mosquitto. Not part of CI; rerun it after large changes
# to the idle paths and commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
idle=${1:-330}
work=${IDLE_ORDER_DIR:-target/idle-order}
mkdir -p "$work"
work=$(realpath "$work")
bin="$work/bramble"
# IDLE_ORDER_DUMP=FILE: write the script from an earlier profile of $bin.
dump=${IDLE_ORDER_DUMP:-}
if [ -z "$dump" ]; then
    command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

    echo "== building an unstripped release binary" >&2
    # (With its unwind tables: valgrind walks stacks by them.)
    CARGO_TARGET_DIR="$work/target" CARGO_PROFILE_RELEASE_STRIP=false BRAMBLE_KEEP_UNWIND_TABLES=1 \
        cargo build --release --quiet
    cp "$work/target/release/bramble" "$bin"

    # The daemon (`… run`) under callgrind; everything else the bench runs as is.
    cat > "$work/wrapper" <<EOF
#!/bin/sh
for a in "\$@"; do
  if [ "\$a" = run ]; then
    exec valgrind --tool=callgrind --demangle=no --compress-strings=no --dump-instr=no \\
      --callgrind-out-file="$work/callgrind.out.%p" "$bin" "\$@"
  fi
done
exec "$bin" "\$@"
EOF
    chmod +x "$work/wrapper"
    rm -f "$work"/callgrind.out.* "$work/daemon.log"

    echo "== the idle daemon under callgrind for ${idle} s" >&2
    BRAMBLE_BIN="$work/wrapper" BENCH_NO_MEDIA=1 BENCH_MQTT=1 BENCH_JOBS=100 \
        BENCH_LOG_LEVEL=info BENCH_DAEMON_LOG="$work/daemon.log" \
        BENCH_SETTLE_SECS=30 BENCH_IDLE_SECS=$((idle + 10)) \
        cargo bench --bench telegram --profile dev >"$work/bench.log" 2>&1 &
    bench=$!
    pid=""
    for _ in $(seq 120); do
        pid=$(pgrep -f "callgrind.*$bin.* run" | head -1 || true)
        [ -n "$pid" ] && break
        sleep 1
    done
    [ -n "$pid" ] || { echo "the daemon did not start under callgrind; see $work/bench.log" >&2; kill $bench; exit 1; }
    # From the end of start-up (the last channel up, a few seconds before the release of
    # the start-up pages), so that the release and what runs right after it are in.
    for _ in $(seq 120); do
        grep -q "Telegram polling" "$work/daemon.log" 2>/dev/null && break
        sleep 0.5
    done
    sleep 3
    callgrind_control -z "$pid" >/dev/null
    sleep "$idle"
    callgrind_control -d "$pid" >/dev/null
    wait $bench || { echo "the bench failed; see $work/bench.log" >&2; exit 1; }
    dump=$(ls "$work"/callgrind.out."$pid".* | head -1)
fi

python3 - "$dump" "$bin" cross/idle-order.ld "$idle" <<'EOF'
import re, sys
dump, binary, out, idle = sys.argv[1:]
# Every function that ran has a block of its own: `ob=` (its object, written when it
# changes) then `fn=`. (`cob=`/`cfn=` lines inside a block name callees.)
names, obj = set(), None
for line in open(dump, errors="replace"):
    if line.startswith("ob="):
        obj = line.split("=", 1)[1].strip()
    elif line.startswith("fn=") and obj == binary:
        names.add(line.split("=", 1)[1].strip())
patterns = set()
for n in names:
    if n.startswith("0x") or not re.match(r"^[A-Za-z_.$][\w.$]*$", n):
        continue
    # Legacy Rust mangling ends in 17h<hash>E: keep the path, drop the hash. The v0
    # mangling (the standard library's) names each crate with a disambiguator
    # (`Cs<base 62>_5alloc`) that changes with the compiler: any.
    n = re.sub(r"17h[0-9a-f]{16}E$", "17h*", n)
    if n.startswith("_R"):
        n = re.sub(r"Cs[0-9A-Za-z]+_(?=\d)", "Cs*_", n)
    patterns.add(n)
# The TLS record layer (api.telegram.org is https; the bench's fake is not):
# rustls's record (de)framing and encryption, ring's AEADs.
tls = ["*rustls*record_layer*", "*rustls*deframer*", "*rustls*read_tls*", "*rustls*write_tls*",
       "*rustls*process_new_packets*", "*rustls*MessageEncrypter*", "*rustls*MessageDecrypter*",
       "*tokio_rustls*", "*4ring4aead*"]
with open(out, "w") as f:
    f.write("/* Generated by cross/idle-order.sh from a callgrind profile of the idle daemon\n"
            f"   (Telegram + MQTT + 100 jobs, {idle} s): {len(patterns)} functions, then the TLS record\n"
            "   layer. build.rs passes it to the linker in release builds; see BENCHMARKS.md. */\n")
    f.write("SECTIONS\n{\n  .text.idle :\n  {\n")
    # LLVM puts cold functions (#[cold]: Vec growth, hash table resizing) under .text.unlikely.
    for p in sorted(patterns) + tls:
        f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
    f.write("  }\n}\nINSERT BEFORE .text;\n")
print(f"{out}: {len(patterns)} functions from {dump}", file=sys.stderr)
EOF
