#!/usr/bin/env bash
# `make gpu-test` whole in ONE device call: the GPU packages (.gpu-site, 48 MiB) and PyAV 19's wheel (35 MB) do not
# fit a call's 64 MiB side by side, so .gpu-site travels packed with xz (about 15 MB) beside the test wheels and PyAV
# (49 MB in all, with the tracked tree's 13 MiB under 64).
#
#   bash benchmarks/gpu_test_carry.sh pack        # here (pip works; .gpu-site built by ../shared/device/gpu-site.sh):
#                                                 # fills .gpu-test-carry/ in the repo root (ignored by git)
#   bash benchmarks/gpu_test_carry.sh run [GT]    # there, from the repo root, carry [".gpu-test-carry"]: unpacks into
#                                                 # /tmp, runs the sound and video GPU tests, the media hardening tests
#                                                 # and the sound and video demos first, then `make gpu-test` in what
#                                                 # is left of GT seconds (540 by default); outputs under $OUT;
#                                                 # GPU_TEST_ADDOPTS=-s shows what native code prints before an abort;
#                                                 # GPU_TEST_ONLY=1 skips the first part: `make gpu-test` alone
set -euo pipefail
DIR=.gpu-test-carry

pack() {
    [ -d .gpu-site ] || { echo "no .gpu-site here: build it with ../shared/device/gpu-site.sh" >&2; exit 1; }
    rm -rf "$DIR" && mkdir -p "$DIR"
    tar -cf - .gpu-site | xz -T0 -6 > "$DIR/gs.tar.xz"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$DIR" \
        pytest-xdist execnet pytest-timeout webdataset pycocotools soxr "av==19.0.2"
    du -sh "$DIR"
}

run() {
    local gt=${1:-540} t0 left
    OUT=${OUT:-/tmp/gpu-test-out}
    mkdir -p "$OUT"
    date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true; nproc
    git rev-parse HEAD 2>/dev/null || true
    rm -rf /tmp/gs /tmp/gsx /tmp/gx && mkdir -p /tmp/gsx /tmp/gx
    tar -C /tmp/gsx -xJf "$DIR/gs.tar.xz" && mv /tmp/gsx/.gpu-site /tmp/gs
    python3 -m pip install -q --no-deps --target /tmp/gx "$DIR"/*.whl
    export PYTHONPATH=/tmp/gs:/tmp/gx:$PWD
    export LD_LIBRARY_PATH=/tmp/gs/nvidia/cu13/lib:/tmp/gs/nvidia/nvjpeg2k/lib:${LD_LIBRARY_PATH:-}
    t0=$(date +%s)
    if [ "${GPU_TEST_ONLY:-0}" = 1 ]; then echo "targeted part skipped (GPU_TEST_ONLY=1)"; else {
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/video tests/audio || true
        python3 -m pytest -q -p no:cacheprovider tests/formats/test_damaged_archives.py \
            tests/video/test_video_hardening.py tests/audio/test_audio_hardening.py || true
        rm -rf /tmp/gpubatch-carry-video /tmp/gpubatch-carry-audio
        python3 -m gpubatch convert sample_data/video /tmp/gpubatch-carry-video --to webdataset --frames every:4 \
            --resize-shorter 64 --device gpu; echo "video demo rc=$?"
        python3 -m gpubatch convert sample_data/audio /tmp/gpubatch-carry-audio --to webdataset --sample-rate 16000 \
            --mono --duration 1 --features "log-mel(n_mels=80)" --device gpu; echo "audio demo rc=$?"
    } > "$OUT/targeted.txt" 2>&1
    echo "targeted in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|rc=" "$OUT/targeted.txt" || true; fi
    left=$(( gt - ($(date +%s) - t0) ))
    if [ "$left" -lt 90 ]; then echo "no time left for make gpu-test ($left s)"; return 0; fi
    PYTEST_ADDOPTS="-rP ${GPU_TEST_ADDOPTS:-}" timeout "$left" make gpu-test > "$OUT/gpu-test.txt" 2>&1 && rc=0 || rc=$?
    echo "make gpu-test rc=$rc in $(( $(date +%s) - t0 )) s (limit $left s)" | tee -a "$OUT/gpu-test.txt"
    tail -22 "$OUT/gpu-test.txt"
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 pack | run [GT]" >&2; exit 2 ;;
esac
