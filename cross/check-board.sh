#!/usr/bin/env bash
# Is BIN really a binary for ARCH's boards? Exit 0 only if it is.
#
#   cross/check-board.sh armv6 BIN      # a Pi Zero W / Pi 1 (ARM1176JZF-S)
#   cross/check-board.sh riscv64 BIN    # RV64GC
#
# armv6: the ELF attributes must say ARMv6 (Tag_CPU_arch v6, v6K or v6KZ; the
# linker records the highest architecture of any object it linked, so one
# ARMv7 object anywhere makes it v7), no Thumb-2, VFP arguments in registers
# (hard float, as Raspberry Pi OS's armhf); then the binary must run
# `--version` under qemu emulating the Pi Zero's very CPU (-cpu arm1176), where
# an ARMv7 instruction on the way is an illegal instruction. Every build must
# pass this: the field has shipped "armv6" binaries that were really ARMv7.
# riscv64: a 64-bit RISC-V ELF with the double-float ABI and compressed
# instructions (RV64GC), run the same way under qemu-riscv64.
# Both are static: nothing from this machine's libraries is involved.
set -euo pipefail

arch="${1:-}" bin="${2:-}"
[ -n "$bin" ] || { echo "usage: $0 armv6|riscv64 BIN" >&2; exit 2; }
[ -f "$bin" ] || { echo "error: no file $bin" >&2; exit 1; }
fail() { echo "error: $bin: $*" >&2; exit 1; }

file -b "$bin" | grep -Eq "statically linked|static-pie linked" || fail "not a static executable: $(file -b "$bin")"
case "$arch" in
    armv6)
        attrs=$(readelf -A "$bin")
        cpu=$(sed -n 's/^ *Tag_CPU_arch: //p' <<<"$attrs")
        echo "$bin: Tag_CPU_arch: $cpu; $(grep -E 'Tag_THUMB_ISA_use|Tag_FP_arch|Tag_ABI_VFP_args' <<<"$attrs" | tr -s ' \n' ' ')"
        [[ "$cpu" =~ ^v6(K|KZ)?$ ]] || fail "Tag_CPU_arch is '$cpu', not v6: it will not run on a Pi Zero W / Pi 1"
        ! grep -q "Tag_THUMB_ISA_use: Thumb-2" <<<"$attrs" || fail "has Thumb-2 code (ARMv6T2/ARMv7), not on ARM1176"
        grep -q "Tag_ABI_VFP_args: VFP registers" <<<"$attrs" || fail "not hard float (Tag_ABI_VFP_args), unlike Raspberry Pi OS armhf"
        qemu=(qemu-arm-static -cpu arm1176)
        ;;
    riscv64)
        file -b "$bin" | grep -q "64-bit LSB .*UCB RISC-V" || fail "not a 64-bit RISC-V binary: $(file -b "$bin")"
        readelf -h "$bin" | grep -q "RVC, double-float ABI" || fail "not RV64GC with the double-float ABI: $(readelf -h "$bin" | grep Flags)"
        qemu=(qemu-riscv64-static)
        ;;
    *) echo "usage: $0 armv6|riscv64 BIN" >&2; exit 2 ;;
esac
command -v "${qemu[0]}" >/dev/null || fail "${qemu[0]} not found (apt-get install qemu-user-static)"
out=$(timeout 300 "${qemu[@]}" "$bin" --version 2>&1) || fail "does not run under ${qemu[*]} (exit $?): $out"
echo "$bin: runs under ${qemu[*]}: $out"
