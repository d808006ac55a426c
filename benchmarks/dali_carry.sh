#!/usr/bin/env bash
# NVIDIA DALI for the bench's `dali` and `dali-defaults` contenders on a GPU machine that cannot install
# packages, where each call may bring at most 64 MiB along. The DALI wheel is ~199 MB, so it goes as a
# trimmed package in pieces, one piece per call, gathered on that machine.
#
#   bash benchmarks/dali_carry.sh pack [VERSION]   # here (pip works): .dali1 .dali2 .dali3 in the repo root
#   bash benchmarks/dali_carry.sh unpack SITE      # there, once per call, from the repo root (carry .daliN):
#                                                  # adds the pieces it finds to /tmp/dali; with all of them,
#                                                  # unpacks into /tmp/dalisite and links nvidia/dali into SITE
#
# Then, there: PYTHONPATH=SITE:$PWD:/tmp/dalisite LD_LIBRARY_PATH=SITE/nvidia/nvimgcodec:... (DALI loads
# libnvimgcodec by name). `pack` keeps the wheel's Python 3.12 modules only, drops its C headers,
# adds the pure-Python dependencies the GPU machine lacks (astunparse, gast, optree, makefun, nvtx,
# libcst), compresses with xz (about 130 MiB) and cuts it so the first piece fits beside .gpu-site.
# Add /.dali1/ /.dali2/ /.dali3/ to .git/info/exclude so they never reach a commit.
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
    rm -rf .dali1 .dali2 .dali3 && mkdir -p .dali1 .dali2 .dali3
    local f="$work/dali.tar.xz" first=13500000 piece=61400000
    dd if="$f" of=.dali1/part1 bs=1M iflag=count_bytes count=$first status=none
    dd if="$f" of=.dali2/part2 bs=1M iflag=skip_bytes,count_bytes skip=$first count=$piece status=none
    dd if="$f" of=.dali3/part3 bs=1M iflag=skip_bytes skip=$((first + piece)) status=none
    [ "$(stat -c %s "$f")" -le $((first + 2 * piece + 2000000)) ] || { echo "dali_carry: the package grew; cut it in more pieces" >&2; exit 1; }
    sha256sum "$f" | cut -c1-16 > .dali1/sha256
    ls -l .dali1 .dali2 .dali3
    rm -rf "$work"
}

unpack() {
    local site=${1:?usage: dali_carry.sh unpack SITE}
    mkdir -p /tmp/dali
    for d in .dali1 .dali2 .dali3; do [ -d "$d" ] && cp "$d"/* /tmp/dali/; done
    if [ ! -f /tmp/dali/part1 ] || [ ! -f /tmp/dali/part2 ] || [ ! -f /tmp/dali/part3 ]; then
        echo "dali_carry: have $(ls /tmp/dali | tr '\n' ' ')"
        return 0
    fi
    cat /tmp/dali/part1 /tmp/dali/part2 /tmp/dali/part3 > /tmp/dali/dali.tar.xz
    [ "$(sha256sum /tmp/dali/dali.tar.xz | cut -c1-16)" = "$(cat /tmp/dali/sha256)" ] || { echo "dali_carry: pieces do not match" >&2; exit 1; }
    mkdir -p /tmp/dalisite && tar -xJf /tmp/dali/dali.tar.xz -C /tmp/dalisite
    ln -sfn /tmp/dalisite/nvidia/dali "$site/nvidia/dali"
    echo "dali_carry: DALI unpacked in /tmp/dalisite, linked from $site/nvidia/dali"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    unpack) shift; unpack "$@" ;;
    *) sed -n 2,16p "$0"; exit 2 ;;
esac
