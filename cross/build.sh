#!/usr/bin/env bash
# Cross-build release binaries for Raspberry Pi (and RISC-V) boards on a Debian
# 12 x86-64 machine, with Debian's own Rust (rustc-web):
#
#   cross/build.sh aarch64     # Pi 3/4/5, Zero 2 W on 64-bit Raspberry Pi OS
#   cross/build.sh armv7       # 32-bit Raspberry Pi OS on ARMv7 boards (Pi 2/3/4), glibc
#   cross/build.sh armv6       # every 32-bit Raspberry Pi OS board, Pi Zero W and Pi 1
#                              # included: ARMv6 + VFPv2, static (musl)
#   cross/build.sh riscv64     # RISC-V boards (riscv64gc), static (musl)
#   cross/build.sh --install aarch64   # first install the toolchain (root, apt-get; pip for zig)
#   cross/build.sh --rustup armv7      # rustup's compiler and std instead of Debian's
#                                      # (rustup target add; only the cross gcc from apt)
#   BRAMBLE_SLIM=1 cross/build.sh aarch64   # the slim build (cross/README.md, "Slim")
#
# aarch64 and armv7 link against Debian's multiarch glibc with its standard
# library (libstd-rust-web-dev:<arch>). armv6 and riscv64 have no Debian std
# (Debian's armhf std is ARMv7; Debian 12 has no riscv64 port): their standard
# library is built from Debian's rust-web-src (the same version as rustc-web)
# with -Zbuild-std, and zig (PyPI, cross/zig-requirements.txt) links them
# statically against a musl it builds for the target CPU (cross/README.md, "ARMv6
# and RISC-V", says why).
#
# Output: target-cross/<triple>/release/bramble (target-cross-rustup/… with
# --rustup; CARGO_TARGET_DIR overrides), checked with `file` and `readelf -A`
# (the field has shipped "armv6" binaries that were really ARMv7).
# The glibc builds need glibc >= 2.36 on the board (Raspberry Pi OS bookworm);
# the static ones run on any Linux of their architecture (bullseye too).
set -euo pipefail
cd "$(dirname "$0")/.."

install=0
rustup=0
while [ $# -gt 0 ]; do
    case "$1" in
        --install) install=1 ;;
        --rustup) rustup=1 ;;
        -*) echo "usage: $0 [--install] [--rustup] aarch64|armv7|armv6|riscv64" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
arch="${1:-aarch64}"
case "$arch" in
    aarch64|arm64) triple=aarch64-unknown-linux-gnu; deb=arm64; gcc=aarch64-linux-gnu-gcc; libc=libc6-dev-arm64-cross
                   env_triple=AARCH64_UNKNOWN_LINUX_GNU; cc_var=CC_aarch64_unknown_linux_gnu ;;
    armv7|armhf)   triple=armv7-unknown-linux-gnueabihf; deb=armhf; gcc=arm-linux-gnueabihf-gcc; libc=libc6-dev-armhf-cross
                   env_triple=ARMV7_UNKNOWN_LINUX_GNUEABIHF; cc_var=CC_armv7_unknown_linux_gnueabihf ;;
    armv6)         triple=arm-unknown-linux-musleabihf; deb=armhf; static=1 ;;
    riscv64)       triple=riscv64gc-unknown-linux-musl; deb=riscv64; static=1 ;;
    *) echo "usage: $0 [--install] [--rustup] aarch64|armv7|armv6|riscv64" >&2; exit 2 ;;
esac
if [ "${static:-0}" = 1 ]; then
    [ "$rustup" = 0 ] || { echo "error: --rustup has no std for $triple (this machine's rustup cannot add targets): drop --rustup" >&2; exit 2; }
    exec cross/static.sh $([ "$install" = 1 ] && echo --install) "$arch" "$triple"
fi

# Install what is missing. The standard library must be the very version of
# Debian's rustc, so it is pinned; a mirror that is down or mid-sync (its index
# for one architecture lagging the others) fails here, naming the package.
install_toolchain() {
    local pkgs=("gcc-${gcc%-gcc}" "$libc" qemu-user-static file binutils lld-16) std=() missing=() p v
    if [ "$rustup" = 1 ]; then
        rustup target add "$triple"
    else
        dpkg --add-architecture "$deb"
        pkgs+=(rustc-web cargo-web)
        std=("libstd-rust-web-dev:$deb")
    fi
    for p in "${pkgs[@]}" "${std[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ "${#missing[@]}" = 0 ] && { echo "toolchain for $arch: installed"; return 0; }
    echo "installing: ${missing[*]}"
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
    for i in 1 2 3; do
        "${apt[@]}" update -qq && break
        echo "apt-get update failed (try $i of 3)" >&2
        sleep $((20 * i))
    done
    export DEBIAN_FRONTEND=noninteractive
    "${apt[@]}" install -y -qq --no-install-recommends --no-remove "${pkgs[@]}" ||
        { echo "error: cannot install the cross toolchain (${pkgs[*]}) from the Debian mirror" >&2; return 1; }
    [ "${#std[@]}" = 0 ] && return 0
    v=$(dpkg-query -W -f='${Version}' rustc-web)
    for i in 1 2 3; do
        "${apt[@]}" install -y -qq --no-install-recommends --no-remove "libstd-rust-web-dev:$deb=$v" && return 0
        echo "libstd-rust-web-dev:$deb=$v not installable (try $i of 3)" >&2
        sleep $((30 * i))
        "${apt[@]}" update -qq || true
    done
    echo "error: cannot install libstd-rust-web-dev:$deb=$v (the $deb standard library for Debian's rustc $v)." >&2
    echo "       Is the Debian mirror down, or its $deb index mid-sync? See: apt-cache policy libstd-rust-web-dev:$deb" >&2
    echo "       Or build with rustup's std: $0 --install --rustup $arch" >&2
    return 1
}
if [ "$install" = 1 ]; then install_toolchain; fi

command -v "$gcc" >/dev/null || { echo "$gcc not found: run $0 --install $arch" >&2; exit 1; }
if [ "$rustup" = 1 ]; then
    # A target dir of its own: the two compilers would rebuild each other's artifacts.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-cross-rustup}"
    rustup target list --installed | grep -qx "$triple" || { echo "no rustup std for $triple: run $0 --install --rustup $arch" >&2; exit 1; }
else
    [ -x /usr/bin/rustc ] || { echo "/usr/bin/rustc (Debian's rustc-web) not found: run $0 --install $arch" >&2; exit 1; }
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-cross}"
    export RUSTC=/usr/bin/rustc
fi
export "CARGO_TARGET_${env_triple}_LINKER=$gcc"
export "$cc_var=$gcc"
# What makes the release binary smaller (BENCHMARKS.md, "Binary"), each
# measured on aarch64:
# - packed relative relocations (DT_RELR, see build.rs): -580 KB. Debian 12's
#   ARM binutils cannot make them, lld >= 15 can (and adds the
#   GLIBC_ABI_DT_RELR version glibc 2.36 checks for; lld 14 does not). gcc
#   links through it with -fuse-ld=lld, finding ld.lld by -B;
# - identical code folding (lld's --icf=all): -71 KB. Rust promises no
#   distinct addresses for distinct functions, so folding is sound;
# (Release builds also leave out the unwind tables, std's included: build.rs,
# cross/no-unwind.ld; -403 KB.)
lld=""
for v in 19 18 17 16 15; do
    [ -x "/usr/lib/llvm-$v/bin/ld.lld" ] && { lld="/usr/lib/llvm-$v/bin"; break; }
done
if [ -n "$lld" ]; then
    echo "linking with $lld/ld.lld: packed relative relocations, identical code folding"
    flags="-C link-arg=-fuse-ld=lld -C link-arg=-B$lld -C link-arg=-Wl,-z,pack-relative-relocs"
    flags="$flags -C link-arg=-Wl,--icf=all"
    # RUSTFLAGS (with --target it reaches the target's crates only, not build
    # scripts) rather than CARGO_TARGET_<triple>_RUSTFLAGS, which a RUSTFLAGS
    # from the caller would silently replace.
    export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$flags"
else
    echo "warning: no lld >= 15 (apt-get install lld-16): linking with GNU ld, without packed relocations (+0.6 MB)" >&2
fi
# BRAMBLE_SLIM=1: the slim build (`--no-default-features --features slim`, cross/README.md "Slim").
features=()
[ "${BRAMBLE_SLIM:-0}" = 1 ] && features=(--no-default-features --features slim)
cargo build --release --locked --target "$triple" "${features[@]}"

bin="$CARGO_TARGET_DIR/$triple/release/bramble"
file "$bin"
if [ "$deb" = armhf ]; then
    readelf -A "$bin" | grep -E "Tag_CPU_arch:" || true
    readelf -A "$bin" | grep -q "Tag_CPU_arch: v7" || { echo "error: $bin is not an ARMv7 binary" >&2; exit 1; }
else
    file "$bin" | grep -q "ARM aarch64" || { echo "error: $bin is not an aarch64 binary" >&2; exit 1; }
fi
echo "glibc needed: $(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
ls -l "$bin"
