#!/usr/bin/env bash
# The Python reference tracer on a CUDA machine, in one run: what `model_trace.torch.trace`
# costs there (python/benchmarks/tracer_overhead.py, float32 and bfloat16), a trace of the
# same seeded SmolLM2-shaped model on the GPU and on the CPU, for `model-trace diff` afterwards,
# and the check that its asynchronous copies of device tensors give the trace that blocking
# ones give (python/benchmarks/cuda_copies.py, with the attention analysis's timings by size).
#
#   OUT=/some/dir scripts/gpu/python-cuda.sh      # from the repository's root
#
# The machine is expected to have python3 with torch (CUDA) and transformers but neither
# blake3 nor orjson, and no network: their wheels (CPython 3.12, manylinux x86_64) come in
# .whl/ (ignored by git; a device run must carry it) and are installed into /tmp/site.
# Each step runs whatever became of the others, under a time limit of its own, and tees its
# output into a log; seven files land in $OUT:
#   python-bench.log, python-bench-float32.json, python-bench-bfloat16.json,
#   python-traces.log, py-smollm-cuda.ndjson, py-smollm-cpu.ndjson, python-copies.json
# and the log ends with a profile of the traced decode step.
# About 2.5-3.5 minutes on an H100 (each Python start imports torch and builds the model: ~10-20 s;
# the copies step took 27 s);
# the steps' limits add up to 10 minutes.
set -u
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bench_log="$OUT/python-bench.log"
traces_log="$OUT/python-traces.log"
status=()

# step NAME LOG SECONDS COMMAND...: runs COMMAND under a time limit, its output appended to LOG
# and shown; its exit status is kept for the summary.
step() {
  local name="$1" log="$2" limit="$3"
  shift 3
  echo "== $name: $*" | tee -a "$log"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc, $((SECONDS - start)) s" | tee -a "$log"
  status+=("$name=$rc")
}

# Without pip, the wheels' files unpacked where pip would put them (neither has scripts or data).
step setup "$bench_log" 30 bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || python3 -c "import glob, zipfile
for wheel in glob.glob(\".whl/*.whl\"): zipfile.ZipFile(wheel).extractall(\"/tmp/site\")"'
export PYTHONPATH="/tmp/site:$PWD/python"
step versions "$bench_log" 60 python3 -c '
import sys, blake3, numpy, torch, transformers, model_trace.floats
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers",
      transformers.__version__, "numpy", numpy.__version__, "blake3", blake3.__version__,
      "orjson formatter", model_trace.floats._orjson is not None)
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'

# QUICK=1: only the decode step's figures, in both dtypes (~1 minute).
if [ -n "${QUICK:-}" ]; then
  for dtype in float32 bfloat16; do
    step "decode-$dtype" "$bench_log" 120 python3 python/benchmarks/tracer_overhead.py --device cuda \
      --dtype "$dtype" --case smollm-decode --rounds 7 --steps 10 \
      --json "$OUT/python-decode-$dtype.json"
  done
  echo "python-cuda: ${status[*]}" | tee -a "$bench_log"
  exit 0
fi
for dtype in float32 bfloat16; do
  step "bench-$dtype" "$bench_log" 180 python3 python/benchmarks/tracer_overhead.py --device cuda \
    --dtype "$dtype" --case smollm,smollm-decode,minilm-shaped --rounds 11 --steps 20 \
    --json "$OUT/python-bench-$dtype.json"
done
for device in cuda cpu; do
  step "trace-$device" "$traces_log" 60 python3 python/benchmarks/device_traces.py --device "$device" \
    --out "$OUT/py-smollm-$device.ndjson"
done
step copies "$traces_log" 90 python3 python/benchmarks/cuda_copies.py --json "$OUT/python-copies.json"
# Where a traced decode step's time goes, should the ratio miss its target: a cProfile of a few
# rounds (profiling slows the traced steps: only the proportions count), its top lines logged.
step profile-decode "$bench_log" 90 python3 python/benchmarks/tracer_overhead.py --device cuda \
  --case smollm-decode --rounds 3 --steps 10 --profile /tmp/python-decode.prof
step profile-top "$bench_log" 30 python3 -c 'import pstats
pstats.Stats("/tmp/python-decode.prof").sort_stats("tottime").print_stats(25)'
echo "python-cuda: ${status[*]}" | tee -a "$bench_log"
