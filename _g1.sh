cp -r .gpu-site /tmp/gpusite && bash benchmarks/dali_carry.sh unpack /tmp/gpusite
export PYTHONPATH=/tmp/gpusite:$PWD LD_LIBRARY_PATH=/tmp/gpusite/nvidia/cu13/lib:/tmp/gpusite/nvidia/nvjpeg2k/lib:$LD_LIBRARY_PATH
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_training_gpu.py -k images 2>&1 | tail -2
