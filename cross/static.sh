#!/usr/bin/env bash
# The static builds, for boards Debian has no standard library for (called by
# cross/build.sh armv6|riscv64; usable alone):
#
#   cross/static.sh [--install] armv6   arm-unknown-linux-musleabihf   # ARMv6 + VFPv2, hard float
#   cross/static.sh [--install] riscv64 riscv64gc-unknown-linux-musl   # RV64GC
#
# The standard library is built from source (-Zbuild-std) out of Debian's
# rust-web-src, the very version of Debian's rustc-web (RUSTC_BOOTSTRAP=1: the
# stable compiler allows the unstable flag). zig, from PyPI pinned by hash
# (cross/zig-requirements.txt), is the C compiler and linker through
# cargo-zigbuild: it builds musl, compiler-rt and libunwind for the target CPU
# (for armv6: generic+v6+vfp2, no Thumb-2), so no ARMv7 object from Debian's
# armhf libraries can end up in the binary. The result is one static
# executable: no glibc floor, nothing needed on the board.
#
# --install: apt-get (rustc-web, cargo-web, rust-web-src, qemu-user-static,
# python3-venv) and a venv with zig at $BRAMBLE_CROSS_TOOLS/zig (default
# target-cross-tools/zig). Checks: cross/check-board.sh (readelf -A for
# ARMv6, then `--version` under qemu with -cpu arm1176 for armv6).
set -euo pipefail
cd "$(dirname "$0")/.."

install=0
[ "${1:-}" = --install ] && { install=1; shift; }
arch="${1:-}"
case "$arch" in
    armv6) triple=arm-unknown-linux-musleabihf ;;
    riscv64) triple=riscv64gc-unknown-linux-musl ;;
    *) echo "usage: $0 [--install] armv6|riscv64" >&2; exit 2 ;;
esac
[ -z "${2:-}" ] || [ "$2" = "$triple" ] || { echo "error: $arch is $triple, not $2" >&2; exit 2; }
tools="${BRAMBLE_CROSS_TOOLS:-$PWD/target-cross-tools}"
venv="$tools/zig"
pinned() { sed -n "s/^$1==\([^ ]*\).*/\1/p" cross/zig-requirements.txt; }

zig_ok() {
    [ -x "$venv/bin/cargo-zigbuild" ] && [ -x "$venv/bin/python-zig" ] &&
        [ "$("$venv/bin/python-zig" version 2>/dev/null)" = "$(pinned ziglang)" ] &&
        [ "$("$venv/bin/cargo-zigbuild" --version 2>/dev/null)" = "cargo-zigbuild $(pinned cargo-zigbuild)" ]
}

install_toolchain() {
    local pkgs=(rustc-web cargo-web qemu-user-static file binutils python3-venv) missing=() p v
    for p in "${pkgs[@]}" rust-web-src; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
    export DEBIAN_FRONTEND=noninteractive
    if [ "${#missing[@]}" != 0 ]; then
        echo "installing: ${missing[*]}"
        for i in 1 2 3; do
            "${apt[@]}" update -qq && break
            echo "apt-get update failed (try $i of 3)" >&2
            sleep $((20 * i))
        done
        "${apt[@]}" install -y -qq --no-install-recommends --no-remove "${pkgs[@]}" ||
            { echo "error: cannot install ${pkgs[*]} from the Debian mirror" >&2; return 1; }
    fi
    # The standard library's source must be the compiler's own version.
    v=$(dpkg-query -W -f='${Version}' rustc-web)
    if [ "$(dpkg-query -W -f='${Version}' rust-web-src 2>/dev/null)" != "$v" ]; then
        "${apt[@]}" install -y -qq --no-install-recommends --no-remove "rust-web-src=$v" ||
            { echo "error: cannot install rust-web-src=$v (the standard library's source for Debian's rustc $v)" >&2; return 1; }
    fi
    if ! zig_ok; then
        echo "installing zig $(pinned ziglang) and cargo-zigbuild $(pinned cargo-zigbuild) into $venv (PyPI, hashes pinned)"
        rm -rf "$venv"
        mkdir -p "$tools"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir --require-hashes -r cross/zig-requirements.txt ||
            { echo "error: cannot install zig from PyPI (cross/zig-requirements.txt)" >&2; return 1; }
    fi
}
if [ "$install" = 1 ]; then install_toolchain; fi

[ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] || { echo "Debian's rustc-web/cargo-web not found: run $0 --install $arch" >&2; exit 1; }
[ -f /usr/lib/rustlib/src/rust/library/Cargo.lock ] || { echo "no standard library source (rust-web-src): run $0 --install $arch" >&2; exit 1; }
zig_ok || { echo "no zig $(pinned ziglang) in $venv: run $0 --install $arch" >&2; exit 1; }

# Debian's cargo and rustc (one version with rust-web-src), zig's venv first.
export PATH="$venv/bin:/usr/bin:$PATH"
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-cross}"
# zig's lld takes one linker script (the last -T wins, measured): build.rs's
# two (cross/no-unwind.ld, cross/idle-order.ld) go in as one, given to the
# binary alone (`rustc -- …` changes no dependency's fingerprint). With
# -Zbuild-std there are no self-contained musl start files in the sysroot:
# zig supplies crt1.o and the rest (link-self-contained=no).
script="$CARGO_TARGET_DIR/$triple/release-link.ld"
mkdir -p "$(dirname "$script")"
cat cross/no-unwind.ld cross/idle-order.ld >"$script.new"
cmp -s "$script.new" "$script" && rm "$script.new" || mv "$script.new" "$script"
export BRAMBLE_NO_IDLE_ORDER=1 BRAMBLE_KEEP_UNWIND_TABLES=1
echo "building $triple: std from $(readlink -f /usr/lib/rustlib/src/rust) ($(rustc -V)), linked by zig $(python-zig version)"
features=()
[ "${BRAMBLE_SLIM:-0}" = 1 ] && features=(--no-default-features --features slim)
cargo-zigbuild rustc --release --locked --target "$triple" -Zbuild-std=std,panic_abort --bin bramble "${features[@]}" \
    -- -C link-self-contained=no -C "link-arg=-Wl,-T,$(readlink -f "$script")"

bin="$CARGO_TARGET_DIR/$triple/release/bramble"
# The one script reached the linker: the idle daemon's code together, no unwind tables.
readelf -SW "$bin" | grep -q ' \.text\.idle ' || { echo "error: $bin has no .text.idle: $script was not applied" >&2; exit 1; }
if readelf -SW "$bin" | grep -E ' \.(eh_frame|gcc_except_table|ARM\.exidx|ARM\.extab) ' >/dev/null; then
    echo "error: $bin has unwind tables: $script was not applied" >&2
    exit 1
fi
cross/check-board.sh "$arch" "$bin"
ls -l "$bin"
