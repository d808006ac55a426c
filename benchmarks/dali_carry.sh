#!/usr/bin/env bash
# NVIDIA DALI for the bench's `dali` and `dali-defaults` contenders on a GPU machine that cannot install
# packages, where each call may bring at most 64 MiB along. The DALI wheel is ~199 MB, so it goes as a
# trimmed package in pieces, one piece per call, gathered on that machine.
#
#   bash benchmarks/dali_carry.sh pack [VERSION]   # here (pip works): .dali1 .dali2 ... in the repo root
#   bash benchmarks/dali_carry.sh cut [FILE]       # here: cut a packed dali.tar.xz into those pieces again
#                                                  # (FILE by default the pieces there, put back together)
#   bash benchmarks/dali_carry.sh unpack SITE      # there, once per call, from the repo root (carry .daliN):
#                                                  # adds the pieces it finds to /tmp/dali; with all of them,
#                                                  # unpacks into /tmp/dalisite and links nvidia/dali into SITE
#
# Then, there: PYTHONPATH=SITE:$PWD:/tmp/dalisite LD_LIBRARY_PATH=SITE/nvidia/nvimgcodec:... (DALI loads
# libnvimgcodec by name). `pack` keeps the wheel's Python 3.12 modules only, drops its C headers,
# adds the pure-Python dependencies the GPU machine lacks (astunparse, gast, optree, makefun, nvtx,
# libcst), compresses with xz (about 130 MiB) and cuts it into pieces of DALI_FIRST and then DALI_PIECE
# bytes (50 MB each: three pieces), each carried alone beside the tracked tree (12.4 MiB on 2026-12-06, when
# 55-MB pieces no longer fitted a call's 64 MiB); .gpu-site goes in a call of its own before them. Re-cut
# them (`cut`) when the tree grows.
# Add /.dali*/ to .git/info/exclude so they never reach a commit.
set -euo pipefail

pack() {
    local version=${1:-2.4.0} work
    work=$(mktemp -d)
    local plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
                --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "nvidia-dali-cuda130==$version" \
        "astunparse<=1.6.3" "gast<=0.7.0" optree makefun nvtx "libcst~=1.8"
    mkdir -p "$work/site"
    for w in "$work"/whl/*.whl; do (cd "$work/site" && python3 -m zipfile -e "$w" .); done
    (cd "$work/site" && find . -name "*cpython-3*" ! -name "*cpython-312-*" -delete &&
        rm -rf nvidia/dali/include bin && find . -name __pycache__ -prune -exec rm -rf {} +)
    tar -C "$work/site" -cf - . | xz -9 -T0 > "$work/dali.tar.xz"
    cut_pieces "$work/dali.tar.xz"
    rm -rf "$work"
}

cut_pieces() {
    local f=${1:-} first=${DALI_FIRST:-50000000} piece=${DALI_PIECE:-50000000} work="" n=1 at
    if [ -z "$f" ]; then  # the pieces here, put back together (and checked) first
        work=$(mktemp -d) && f="$work/dali.tar.xz"
        local count; count=$(cat .dali1/pieces 2>/dev/null || echo 3)
        for ((i = 1; i <= count; i++)); do cat ".dali$i/part$i"; done > "$f"
        [ "$(sha256sum "$f" | cut -c1-16)" = "$(cat .dali1/sha256)" ] || { echo "dali_carry: the pieces here do not match" >&2; exit 1; }
    fi
    local size; size=$(stat -c %s "$f")
    rm -rf .dali[0-9]*
    mkdir -p .dali1 && dd if="$f" of=.dali1/part1 bs=1M iflag=count_bytes count="$first" status=none
    at=$first
    while [ "$at" -lt "$size" ]; do
        n=$((n + 1)) && mkdir -p ".dali$n"
        dd if="$f" of=".dali$n/part$n" bs=1M iflag=skip_bytes,count_bytes skip="$at" count="$piece" status=none
        at=$((at + piece))
    done
    echo "$n" > .dali1/pieces
    sha256sum "$f" | cut -c1-16 > .dali1/sha256
    ls -l .dali[0-9]*
    [ -z "$work" ] || rm -rf "$work"
}

unpack() {
    local site=${1:?usage: dali_carry.sh unpack SITE}
    mkdir -p /tmp/dali
    for d in .dali[0-9]*; do [ -d "$d" ] && cp "$d"/* /tmp/dali/; done
    local count; count=$(cat /tmp/dali/pieces 2>/dev/null || echo 3)  # (pieces cut before 2026-12-03: three)
    for ((i = 1; i <= count; i++)); do
        if [ ! -f "/tmp/dali/part$i" ]; then
            echo "dali_carry: have $(ls /tmp/dali | tr '\n' ' ')"
            return 0
        fi
    done
    for ((i = 1; i <= count; i++)); do cat "/tmp/dali/part$i"; done > /tmp/dali/dali.tar.xz
    [ "$(sha256sum /tmp/dali/dali.tar.xz | cut -c1-16)" = "$(cat /tmp/dali/sha256)" ] || { echo "dali_carry: pieces do not match" >&2; exit 1; }
    mkdir -p /tmp/dalisite && tar -xJf /tmp/dali/dali.tar.xz -C /tmp/dalisite
    ln -sfn /tmp/dalisite/nvidia/dali "$site/nvidia/dali"
    echo "dali_carry: DALI unpacked in /tmp/dalisite, linked from $site/nvidia/dali"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    cut) shift; cut_pieces "$@" ;;
    unpack) shift; unpack "$@" ;;
    *) sed -n 2,19p "$0"; exit 2 ;;
esac
