cp -r .gpu-site /tmp/gpusite && cp -r .wids /tmp/wids && bash benchmarks/dali_carry.sh unpack /tmp/gpusite; date -u
