cp -r .gpu-site /tmp/gpusite && cp -r .wids /tmp/wids && bash benchmarks/dali_carry.sh unpack /tmp/gpusite
export PYTHONPATH=/tmp/gpusite:/tmp/wids:$PWD LD_LIBRARY_PATH=/tmp/gpusite/nvidia/cu13/lib:/tmp/gpusite/nvidia/nvjpeg2k/lib:$LD_LIBRARY_PATH
date -u; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_training_gpu.py tests/test_training.py -k "not audio_datasets" 2>&1 | tail -4
