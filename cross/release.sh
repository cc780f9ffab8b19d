#!/usr/bin/env bash
# Build a release: .debs and plain tarballs for every board, and SHA256SUMS.
#
#   cross/release.sh 0.1.0          # VERSION must be Cargo.toml's version
#
# On an x86-64 Debian 12 machine, from a clean checkout, as root the first time
# (cross/build.sh --install puts Debian's cross toolchain in place). Output in
# target-release/<VERSION>/:
#   bramble_<VERSION>_{amd64,arm64,armhf,riscv64}.deb
#       armhf is the ARMv6 static build (every 32-bit Raspberry Pi OS board,
#       Pi Zero W and Pi 1 included), riscv64 the RV64GC static build
#   bramble-<VERSION>-{x86_64,aarch64,armv7}-linux-gnu.tar.gz
#   bramble-<VERSION>-armv6-linux-musleabihf.tar.gz, bramble-<VERSION>-riscv64gc-linux-musl.tar.gz
#       bramble-<VERSION>-<arch>/bramble, bramble.service, README.md, LICENSE-NOTICE,
#       LICENSE-MIT, LICENSE-APACHE
#   bramble-slim-<VERSION>-<arch>.tar.gz for the same five <arch>
#       the slim build (`--no-default-features --features slim`: scheduler,
#       heartbeat, file/exec/web_fetch/cron/message tools, Telegram text, MQTT,
#       the sandbox) as bramble-slim-<VERSION>-<arch>/bramble-slim, with the same
#       files. Not in the .debs (they stay one full binary: a package carrying
#       both would be the full size plus the slim one on the smallest boards);
#       cross/README.md, "Slim", says how to use it in place of the .deb's.
# DEB_MAINTAINER="Name <address>" is required: the .debs' Maintainer line.
#   SHA256SUMS
#
# The packaging is deterministic: files sorted, owned by root, dated at the
# commit's time (SOURCE_DATE_EPOCH), gzip without a timestamp, build paths
# remapped out of the binaries. Shown: two runs at one commit, in two checkout
# directories, gave identical SHA256SUMS for all six files (BENCHMARKS.md;
# before the static builds were added).
# The same toolchain is needed for the same bytes (Debian's std or rustup's,
# whichever the run used: it says so). A tree with uncommitted changes is
# refused: a release is a commit.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-}"
cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
if [ -z "$version" ]; then
    echo "usage: $0 VERSION   (Cargo.toml says $cargo_version)" >&2
    exit 2
fi
if [ "$version" != "$cargo_version" ]; then
    echo "error: VERSION $version is not Cargo.toml's version $cargo_version: change Cargo.toml first" >&2
    exit 1
fi
if [ -n "$(git status --porcelain --untracked-files=no)" ] && [ "${RELEASE_ALLOW_DIRTY:-}" != 1 ]; then
    echo "error: the checkout has uncommitted changes; commit them (or RELEASE_ALLOW_DIRTY=1 for a trial)" >&2
    exit 1
fi
if [ -z "${DEB_MAINTAINER:-}" ]; then
    echo "error: set DEB_MAINTAINER=\"Name <address>\" (the .debs' Maintainer: who answers for them)" >&2
    exit 1
fi
commit=$(git rev-parse --short=12 HEAD)
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
# The build directory must not end up in the binaries (panic messages carry paths).
export RUSTFLAGS="${RUSTFLAGS:-} --remap-path-prefix=$PWD=/build/bramble --remap-path-prefix=$HOME=/home"
out="target-release/$version"
rm -rf "$out"
mkdir -p "$out"
echo "== release $version ($commit), SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH, into $out"

echo "== amd64: cargo build --release"
CARGO_TARGET_DIR=target-release/amd64 cargo build --release --locked
amd64=target-release/amd64/release/bramble

echo "== arm64 and armv7 (glibc): cross/build.sh"
# Debian's std for an architecture can lag its rustc while a mirror syncs
# (seen for armhf for hours): then rustup's std, the same compiler's own.
# SUFFIX (-slim or empty) names the target directories: the slim build has
# its own, so the full binaries stay where they were built.
cross_build() {
    local arch=$1 triple=$2 suffix=${3:-}
    if CARGO_TARGET_DIR=target-cross$suffix cross/build.sh --install "$arch" >&2; then
        echo "target-cross$suffix/$triple/release/bramble"
    else
        echo "== Debian's $arch toolchain failed; rustup's std instead" >&2
        CARGO_TARGET_DIR=target-cross-rustup$suffix cross/build.sh --install --rustup "$arch" >&2
        echo "target-cross-rustup$suffix/$triple/release/bramble"
    fi
}
arm64=$(cross_build aarch64 aarch64-unknown-linux-gnu)
armv7=$(cross_build armv7 armv7-unknown-linux-gnueabihf)

# The static builds: std from Debian's rust-web-src, zig from PyPI (pinned);
# cross/check-board.sh runs each under qemu as the board's CPU (arm1176 for armv6).
echo "== armv6 and riscv64: cross/build.sh (static, -Zbuild-std)"
CARGO_TARGET_DIR=target-cross cross/build.sh --install armv6
CARGO_TARGET_DIR=target-cross cross/build.sh --install riscv64
armv6=target-cross/arm-unknown-linux-musleabihf/release/bramble
riscv64=target-cross/riscv64gc-unknown-linux-musl/release/bramble

echo "== the slim build (cross/README.md, \"Slim\"): amd64, arm64, armv7, armv6, riscv64"
CARGO_TARGET_DIR=target-release/amd64-slim cargo build --release --locked --no-default-features --features slim
amd64_slim=target-release/amd64-slim/release/bramble
arm64_slim=$(BRAMBLE_SLIM=1 cross_build aarch64 aarch64-unknown-linux-gnu -slim)
armv7_slim=$(BRAMBLE_SLIM=1 cross_build armv7 armv7-unknown-linux-gnueabihf -slim)
BRAMBLE_SLIM=1 CARGO_TARGET_DIR=target-cross-slim cross/build.sh --install armv6
BRAMBLE_SLIM=1 CARGO_TARGET_DIR=target-cross-slim cross/build.sh --install riscv64
armv6_slim=target-cross-slim/arm-unknown-linux-musleabihf/release/bramble
riscv64_slim=target-cross-slim/riscv64gc-unknown-linux-musl/release/bramble
# A slim binary must say so (`--version` names the build) and must not be a full one.
for bin in "$amd64_slim"; do
    "$bin" --version | grep -q slim || { echo "error: $bin --version does not say slim" >&2; exit 1; }
done

for pair in "amd64:$amd64" "arm64:$arm64" "armhf:$armv6" "riscv64:$riscv64"; do
    deb_arch=${pair%%:*}
    bin=${pair#*:}
    echo "== $deb_arch: .deb"
    BRAMBLE_BIN="$bin" OUT_DIR="$out" DEB_VERSION="$version" cross/deb.sh "$deb_arch"
done

# Plain tarballs, for systems without dpkg.
# PROGRAM: bramble, or bramble-slim (the slim build, under that name).
tarball() {
    local bin=$1 triple=$2 program=${3:-bramble}
    local name="$program-$version-$triple" dir
    dir=$(mktemp -d)
    mkdir "$dir/$name"
    install -m 0755 "$bin" "$dir/$name/$program"
    install -m 0644 systemd/bramble.service README.md LICENSE-MIT LICENSE-APACHE "$dir/$name/"
    printf 'bramble %s (%s)\nCopyright 2026 the bramble authors\nLicense: MIT OR Apache-2.0 (Cargo.toml)\n' \
        "$version" "$commit" >"$dir/$name/LICENSE-NOTICE"
    touch -d "@$SOURCE_DATE_EPOCH" "$dir/$name" "$dir/$name"/*
    tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
        --format=gnu -C "$dir" -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
    rm -rf "$dir"
}
echo "== tarballs"
tarball "$amd64" x86_64-linux-gnu
tarball "$arm64" aarch64-linux-gnu
tarball "$armv7" armv7-linux-gnu
tarball "$armv6" armv6-linux-musleabihf
tarball "$riscv64" riscv64gc-linux-musl
tarball "$amd64_slim" x86_64-linux-gnu bramble-slim
tarball "$arm64_slim" aarch64-linux-gnu bramble-slim
tarball "$armv7_slim" armv7-linux-gnu bramble-slim
tarball "$armv6_slim" armv6-linux-musleabihf bramble-slim
tarball "$riscv64_slim" riscv64gc-linux-musl bramble-slim

(cd "$out" && sha256sum -- *.deb *.tar.gz >SHA256SUMS)
echo "== done: $out"
cat "$out/SHA256SUMS"
