export PYTHONPATH=/tmp/gpusite:/tmp/wids:$PWD:/tmp/dalisite LD_LIBRARY_PATH=/tmp/gpusite/nvidia/cu13/lib:/tmp/gpusite/nvidia/nvjpeg2k/lib:/tmp/gpusite/nvidia/nvimgcodec:$LD_LIBRARY_PATH
date -u
python3 -c "from pathlib import Path; from gpubatch.synthetic import make_jpeg_set; make_jpeg_set(Path('/tmp/lj'), 8192)"
python3 -m gpubatch convert /tmp/lj /tmp/lj-wds --to webdataset --shard-size 512 --device cpu --overwrite > /dev/null
python3 -m gpubatch bench --model resnet50 --data /tmp/lj-wds --seconds 5 --baselines gpubatch-loader,dali-reader --json $OUT/loader-wds.json 2>&1 | grep -E "│ (gpubatch|dali)|fastest|Error|error"
date -u
