#!/usr/bin/env bash
# Build a Debian package from an already-built release binary, with plain
# dpkg-deb (nothing to download or compile besides bramble itself):
#
#   cross/deb.sh amd64     # target/release/bramble            (cargo build --release)
#   cross/deb.sh arm64     # target-cross/aarch64-…/bramble     (cross/build.sh aarch64)
#   cross/deb.sh armhf     # target-cross/arm-…-musleabihf/bramble (cross/build.sh armv6)
#   cross/deb.sh riscv64   # target-cross/riscv64gc-…-musl/bramble  (cross/build.sh riscv64)
#
# armhf is the ARMv6 build: Raspberry Pi OS's armhf is one userland for every
# 32-bit Pi, the Pi Zero W and Pi 1 (ARMv6) included, so a package named armhf
# must run on ARMv6; it runs on ARMv7 and ARMv8 boards too. The ARMv7 glibc
# build (cross/build.sh armv7) is refused here (cross/README.md says why).
# The static builds (armhf, riscv64) depend on no libc6.
#
# BRAMBLE_BIN=path overrides the binary, DEB_VERSION the version (default:
# Cargo.toml's). OUT_DIR (default: target-deb) is where
# bramble_<version>_<arch>.deb goes. The package holds:
#   /usr/bin/bramble
#   /usr/share/man/man1/bramble.1.gz, bash/zsh/fish completions (from build.rs)
#   /usr/lib/systemd/system/bramble.service
#   /usr/lib/sysusers.d/bramble.conf, /usr/lib/tmpfiles.d/bramble.conf
#   /etc/bramble/config.toml         conffile, 0640 root:bramble (group set by postinst)
#   /usr/share/bramble/workspace/    templates; postinst copies them to
#                                    /var/lib/bramble/workspace when that is absent
#   /usr/share/doc/bramble/          README.md, copyright, changelog
# The service is not enabled or started on install (it needs an API key first):
# `systemctl enable --now bramble` does that. Upgrades restart it if it runs.
set -euo pipefail
cd "$(dirname "$0")/.."

arch="${1:-}"
case "$arch" in
    amd64) triple=""; want="x86-64" ;;
    arm64) triple=aarch64-unknown-linux-gnu; want="ARM aarch64" ;;
    armhf) triple=arm-unknown-linux-musleabihf; want="ARM, EABI5"; board=armv6 ;;
    riscv64) triple=riscv64gc-unknown-linux-musl; want="UCB RISC-V"; board=riscv64 ;;
    *) echo "usage: $0 amd64|arm64|armhf|riscv64" >&2; exit 2 ;;
esac
if [ -n "${BRAMBLE_BIN:-}" ]; then
    bin="$BRAMBLE_BIN"
elif [ -z "$triple" ]; then
    bin="${CARGO_TARGET_DIR:-target}/release/bramble"
else
    bin="${CARGO_TARGET_DIR:-target-cross}/$triple/release/bramble"
fi
[ -f "$bin" ] || { echo "error: no binary at $bin: build it first (see the top of $0)" >&2; exit 1; }
file -b "$bin" | grep -q "$want" || { echo "error: $bin is not a $arch binary: $(file -b "$bin")" >&2; exit 1; }
if [ -n "${board:-}" ]; then
    # ARMv6 attributes (an armhf package runs on every Raspberry Pi OS board)
    # and a run under qemu as the board's CPU.
    cross/check-board.sh "$board" "$bin" || { echo "error: not packaging $bin as $arch" >&2; exit 1; }
fi

version="${DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)}"
[ -n "$version" ] || { echo "error: no version in Cargo.toml" >&2; exit 1; }
# The libc6 floor: 2.36 for every glibc build (Debian 12, Raspberry Pi OS
# bookworm), the one cross/README.md and README.md name, or the newest glibc
# symbol version the binary uses if that is newer. Packed relative relocations
# (build.rs) need 2.36 too, named by a version dependency rather than a symbol.
# A static binary (no program interpreter: armhf, riscv64) needs no libc6.
if readelf -lW "$bin" | grep -q "Requesting program interpreter"; then
    glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    glibc=$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -1)
    libc_dep="libc6 (>= $glibc), "
else
    libc_dep="" glibc="none (static)"
fi

# DEB_MAINTAINER="Name <address>" names who answers for the package. A
# release (cross/release.sh, the release workflow) requires it; a local build
# says it is a local one.
maintainer="${DEB_MAINTAINER:-$(git config user.name 2>/dev/null || echo "$(id -un)") (local build) <$(git config user.email 2>/dev/null || echo "$(id -un)@$(hostname)")>}"
case "$maintainer" in
    *"<"*"@"*">"*) ;;
    *) echo "error: DEB_MAINTAINER must be \"Name <address>\": $maintainer" >&2; exit 1 ;;
esac
out="${OUT_DIR:-target-deb}"
mkdir -p "$out"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
pkg="$root/bramble"

install -D -m 0755 "$bin" "$pkg/usr/bin/bramble"
# The man page and shell completions build.rs wrote from the CLI's definition,
# beside the binary's build (the newest such directory: the latest build).
gen=$(find "$(dirname "$bin")/build" -path '*/bramble-*/out/bramble.1' -printf '%T@ %h\n' 2>/dev/null |
    sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$gen" ] || { echo "error: no bramble.1 from build.rs under $(dirname "$bin")/build: build the binary with cargo first" >&2; exit 1; }
install -d "$pkg/usr/share/man/man1"
gzip -9n < "$gen/bramble.1" > "$pkg/usr/share/man/man1/bramble.1.gz"
chmod 0644 "$pkg/usr/share/man/man1/bramble.1.gz"
install -D -m 0644 "$gen/bramble.bash" "$pkg/usr/share/bash-completion/completions/bramble"
install -D -m 0644 "$gen/_bramble" "$pkg/usr/share/zsh/vendor-completions/_bramble"
install -D -m 0644 "$gen/bramble.fish" "$pkg/usr/share/fish/vendor_completions.d/bramble.fish"
install -D -m 0644 systemd/bramble.service "$pkg/usr/lib/systemd/system/bramble.service"
install -D -m 0644 systemd/bramble.sysusers "$pkg/usr/lib/sysusers.d/bramble.conf"
install -D -m 0644 systemd/bramble.tmpfiles "$pkg/usr/lib/tmpfiles.d/bramble.conf"

# The example config with the service's paths filled in, so `bramble` run by
# hand (`sudo bramble …`, which acts as the bramble user) finds the
# same workspace and state as the service.
install -d -m 0750 "$pkg/etc/bramble"
sed -e 's|^# workspace = "~/.local/share/bramble/workspace".*$|workspace = "/var/lib/bramble/workspace"|' \
    -e 's|^# state_dir = "~/.local/state/bramble".*$|state_dir = "/var/lib/bramble"|' \
    config/bramble.toml > "$pkg/etc/bramble/config.toml"
chmod 0640 "$pkg/etc/bramble/config.toml"
for line in 'workspace = "/var/lib/bramble/workspace"' 'state_dir = "/var/lib/bramble"'; do
    grep -qxF "$line" "$pkg/etc/bramble/config.toml" ||
        { echo "error: config/bramble.toml changed: cannot set '$line'" >&2; exit 1; }
done

(cd config && find workspace -type f) | while read -r f; do
    install -D -m 0644 "config/$f" "$pkg/usr/share/bramble/$f"
done

doc="$pkg/usr/share/doc/bramble"
install -D -m 0644 README.md "$doc/README.md"
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: bramble

Files: *
Copyright: 2026 the bramble authors
License: MIT or Apache-2.0
 On Debian systems the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.

License: MIT
$(sed 's/^$/./; s/^/ /' LICENSE-MIT)
EOF
printf 'bramble (%s) unstable; urgency=medium\n\n  * Built by cross/deb.sh.\n\n -- %s  %s\n' \
    "$version" "$maintainer" "$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")" |
    gzip -9n > "$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"

# /etc/bramble may hold secrets: not world-readable, on purpose.
install -d "$pkg/usr/share/lintian/overrides"
printf 'bramble: %s\n' 'non-standard-dir-perm 0750 != 0755 [etc/bramble/]' \
    'non-standard-file-perm 0640 != 0644 [etc/bramble/config.toml]' > "$pkg/usr/share/lintian/overrides/bramble"
chmod 0644 "$pkg/usr/share/lintian/overrides/bramble"

install -d "$pkg/DEBIAN"
cat > "$pkg/DEBIAN/control" <<EOF
Package: bramble
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
Depends: ${libc_dep}ca-certificates, tzdata, adduser
Recommends: systemd-timesyncd | time-daemon
Suggests: mosquitto
Section: net
Priority: optional
Description: small scheduler-first AI agent for Raspberry Pi-class boards
 bramble runs cron jobs, a heartbeat and an LLM agent loop (OpenAI-compatible
 or Anthropic models) with tools for files, shell commands and the web, and
 delivers reports to Telegram, MQTT or the journal through a durable outbox.
 .
 The package installs a hardened systemd service (Type=notify, watchdog) that
 runs as the system user bramble. It is not started until enabled:
 edit /etc/bramble/config.toml, then run: systemctl enable --now bramble
EOF
echo /etc/bramble/config.toml > "$pkg/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "cross/debian/$script" "$pkg/DEBIAN/$script"
done
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/md5sums" "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles"

deb="$out/bramble_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb ($(stat -c %s "$deb") bytes; libc6: $glibc)"
