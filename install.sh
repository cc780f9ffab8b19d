#!/bin/sh
# Install bramble's .deb from a release, for this machine's architecture.
#
#   curl -fsSLO https://github.com/<owner>/bramble/releases/latest/download/install.sh
#   sudo sh install.sh
#
# It picks bramble_<version>_<arch>.deb for `dpkg --print-architecture` (else
# `uname -m`): amd64, arm64, armhf (the ARMv6 build: every 32-bit Raspberry Pi
# OS board, the Pi Zero W and Pi 1 included) or riscv64; downloads it and the release's SHA256SUMS, checks the file
# against its line there (`sha256sum --check`), and installs it with apt (which
# fetches the dependencies). A file whose checksum does not match is deleted
# and nothing is installed. The release workflow (.github/workflows/release.yml)
# writes the release's own address into the copy it publishes; this copy in the
# repository needs --base-url.
#
# Options:
#   --base-url URL        where the release's files are (a directory holding SHA256SUMS)
#   --download-only DIR   download and verify into DIR; install nothing
#   --dry-run             download and verify, then print the install command
#   --arch ARCH           amd64, arm64, armhf or riscv64 instead of this machine's
set -eu

BASE_URL="${BRAMBLE_RELEASE_URL:-@RELEASE_URL@}"
DEST=""
DRY_RUN=0
ARCH=""

die() { echo "install.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --base-url) [ $# -ge 2 ] || die "--base-url needs a URL"; BASE_URL="$2"; shift 2 ;;
        --download-only) [ $# -ge 2 ] || die "--download-only needs a directory"; DEST="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --arch) [ $# -ge 2 ] || die "--arch needs amd64, arm64, armhf or riscv64"; ARCH="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
case "$BASE_URL" in
    @*@|"") die "no release address: pass --base-url URL (the directory holding SHA256SUMS)" ;;
    https://*|http://127.0.0.1*|http://localhost*) ;;
    *) die "--base-url must be https:// (or a local http://127.0.0.1 server for tests): $BASE_URL" ;;
esac
BASE_URL="${BASE_URL%/}"

if [ -z "$ARCH" ]; then
    if command -v dpkg >/dev/null 2>&1; then
        ARCH=$(dpkg --print-architecture)
    else
        case "$(uname -m)" in
            x86_64) ARCH=amd64 ;;
            aarch64|arm64) ARCH=arm64 ;;
            armv6l|armv7l|armv8l) ARCH=armhf ;;
            riscv64) ARCH=riscv64 ;;
            *) ARCH="$(uname -m)" ;;
        esac
    fi
fi
case "$ARCH" in
    amd64|arm64|armhf|riscv64) ;;
    armel) die "no armel package (soft float): on an ARMv6 board with VFP, the release's bramble-<version>-armv6-linux-musleabihf.tar.gz runs as it is (static)" ;;
    *) die "no build for the architecture $ARCH: the releases have amd64, arm64, armhf (ARMv6 and up) and riscv64" ;;
esac

if command -v curl >/dev/null 2>&1; then
    fetch() { curl -fsSL --proto '=https,http' -o "$2" "$1"; }
elif command -v wget >/dev/null 2>&1; then
    fetch() { wget -q -O "$2" "$1"; }
else
    die "neither curl nor wget is installed (sudo apt install curl)"
fi
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is missing (it is in coreutils)"

if [ -n "$DEST" ]; then
    mkdir -p "$DEST"
    WORK="$DEST"
else
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
fi

fetch "$BASE_URL/SHA256SUMS" "$WORK/SHA256SUMS" || die "cannot download $BASE_URL/SHA256SUMS"
# The one line for this architecture's package: `<sha256>  bramble_<version>_<arch>.deb`.
LINE=$(grep -E "^[0-9a-f]{64}  bramble_[0-9A-Za-z.~+-]+_${ARCH}\.deb\$" "$WORK/SHA256SUMS" | head -1 || true)
[ -n "$LINE" ] || die "SHA256SUMS at $BASE_URL names no .deb for $ARCH"
FILE=${LINE#*  }
echo "== $FILE for $ARCH from $BASE_URL"
fetch "$BASE_URL/$FILE" "$WORK/$FILE" || die "cannot download $BASE_URL/$FILE"
if ! (cd "$WORK" && printf '%s\n' "$LINE" | sha256sum --check --status); then
    rm -f "$WORK/$FILE"
    die "checksum mismatch for $FILE: not installed (the download was damaged or altered; try again)"
fi
echo "== checksum ok: $FILE"

if [ -n "$DEST" ]; then
    echo "downloaded and verified: $DEST/$FILE"
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    set -- apt-get install -y "$WORK/$FILE"
else
    set -- dpkg -i "$WORK/$FILE"
fi
if [ "$DRY_RUN" = 1 ]; then
    echo "would run: $*"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "run as root (sudo sh install.sh)"
    set -- sudo "$@"
fi
"$@"
echo "== installed. Next: put the API key in /etc/bramble/env, check /etc/bramble/config.toml (sudo bramble doctor), then: sudo systemctl enable --now bramble"
