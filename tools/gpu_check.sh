#!/usr/bin/env bash
# One device run: build with 16 jobs, the full test suite on the GPU, compute-sanitizer
# (memcheck, racecheck, initcheck, synccheck) over tools/sanitizer_smoke.py, and the
# benchmark; logs under $OUT, a short summary table last.
#
#   STAGES="build test sanitize bench" ONLY=<families, comma-separated> BENCH_ARGS="--full" \
#   TEST_FILES_IN_PARALLEL=1 (one pytest process per test file, then the big_memory tests unless BIG_MEMORY=0) \
#   BENCH_CASES="<'|'-separated case-name substrings>" \
#   SANITIZERS="memcheck racecheck initcheck synccheck" bash tools/gpu_check.sh
#
# BENCH_ARGS is split on spaces; case names hold spaces, so they go in BENCH_CASES.
#
# Stage `profile` (not in the default list) runs Nsight Compute over the benchmark cases
# whose names contain one of the '|'-separated PROFILE_CASES substrings, ours and peers.
# Stage `timeline` (not in the default list) prints the kernel timeline, streams and
# overlap visible, of the TIMELINE_CASES cases (tools/timeline_cases.py); it shares
# profile.log with `profile`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/baracuda_out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build test sanitize bench"}
ONLY=${ONLY:-}
BENCH_ARGS=${BENCH_ARGS:-"--full"}
# At most 8 files come back from $OUT: gpu.txt, build.log, tests.log, sanitizer.log,
# bench.log, bench.json, bench.png, profile.log.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The GPU image's Python was built with /opt/gcc, whose g++ (distutils' default
# linker there) links a static libstdc++ into the extension; with objects compiled
# by the system c++ that copy crashed formatting numbers in error messages.
# Compile and link with the system compiler.
export CC=gcc CXX=g++ LDSHARED="g++ -shared" LDCXXSHARED="g++ -shared"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
declare -A RESULT

# Not over peers_env.sh's install (/tmp/site/.peers-ok): reinstalling the cutlass-dsl wheels
# there would delete the CUDA library it joined into them, and quack would not import.
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.peers-ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /tmp/wheels.log 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' >> "$OUT/gpu.txt"

stage() { [[ " $STAGES " == *" $1 "* ]]; }

if stage build; then
  start=$(date +%s)
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  rc=$?
  libstdcxx=$(ldd baracuda_ops/_C*.so 2>/dev/null | grep -c 'libstdc++')
  RESULT[build]="rc=$rc $(( $(date +%s) - start ))s, links libstdc++ dynamically: $libstdcxx"
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; fi
fi

if stage test; then
  start=$(date +%s)
  # The test files import expecttest, which the GPU image lacks: carry .whl (staged by
  # ../shared/tools/stage_peers.sh), or those files fail to collect.
  python3 -c 'import expecttest' 2>/dev/null || echo "WARNING: expecttest is missing; carry .whl, or most test files will not collect"
  filter=()
  [ -n "$ONLY" ] && filter=(-k "${ONLY//,/ or }")
  if [ -n "${TEST_FILES_IN_PARALLEL:-}" ]; then
    # One pytest process per test file, all at once (the suite is mostly CPU-bound), then the
    # big_memory tests (tensors past 2^31 elements, up to 40 GiB each) one at a time; their
    # logs one after another in tests.log, a summary line per file last.
    pids=()
    for f in test/test_*.py; do
      python3 -m pytest "$f" -q -rfE -p no:logging -p no:cacheprovider -m "not big_memory" "${filter[@]}" \
        > "/tmp/tests_$(basename "$f").log" 2>&1 &
      pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do
      wait "$pid"; r=$?
      [ $r -eq 5 ] && r=0  # no test of this file matched the ONLY filter
      [ $r -gt $rc ] && rc=$r
    done
    if [ "${BIG_MEMORY:-1}" = 1 ]; then
      python3 -m pytest test -q -rfEs -p no:logging -p no:cacheprovider -m big_memory "${filter[@]}" \
        > /tmp/tests_test_big_memory.log 2>&1
      r=$?
      [ $r -eq 5 ] && r=0
      [ $r -gt $rc ] && rc=$r
    fi
    : > "$OUT/tests.log"
    for f in /tmp/tests_test_*.log; do { echo "=== $f"; cat "$f"; } >> "$OUT/tests.log"; done
    for f in /tmp/tests_test_*.log; do echo "$(basename "$f" .log): $(tail -1 "$f")"; done >> "$OUT/tests.log"
    summary=$(for f in /tmp/tests_test_*.log; do tail -1 "$f"; done | tr '\n' ' ')
  else
    python3 -m pytest test -q -rfE -p no:logging -p no:cacheprovider "${filter[@]}" > "$OUT/tests.log" 2>&1
    rc=$?
    summary=$(tail -1 "$OUT/tests.log")
  fi
  RESULT[test]="rc=$rc $summary $(( $(date +%s) - start ))s"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
fi

# synccheck and clusters of more than 8 CTAs (the sizes past the portable 8, which our
# long-row kernels opt in to): at the first such launch synccheck ends the process with an
# illegal address and no error of its own (rms_norm's row clusters of 16 at float32 rows of
# 130000), or first reports "Missing wait" at the bulk-copy barriers of rms_norm_fused's
# streamed cluster backward (16-bit rows of 40000). The same launches are clean under memcheck
# and racecheck and give the reference's results, and the same kernels in clusters of 8 are
# clean under synccheck: its rms_norm and rms_norm_fused results stop there.
if stage sanitize; then
  for tool in ${SANITIZERS:-memcheck racecheck initcheck synccheck}; do
    start=$(date +%s)
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check no)
    # initcheck must see every kernel's writes (torch's too), so only the other tools filter to our kernels.
    # racecheck must instrument all of ours: filtered to some, the first uninstrumented cluster kernel
    # that uses another CTA's shared memory (rms_norm's backward cluster rows, rms_norm_fused's forward
    # row clusters or backward cluster rows) ends the process with an illegal address, whichever of
    # them the filter leaves out; with every one instrumented it is clean, as is memcheck either way.
    [ "$tool" != initcheck ] && extra+=(--kernel-name kns=baracuda)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" "${extra[@]}" \
      --error-exitcode 97 python3 tools/sanitizer_smoke.py $ONLY > /tmp/sanitizer_$tool.log 2>&1
    rc=$?
    { echo "=== $tool rc=$rc"; cat /tmp/sanitizer_$tool.log; } >> "$OUT/sanitizer.log"
    RESULT[$tool]="rc=$rc $(grep -E 'ERROR SUMMARY|sanitizer smoke' /tmp/sanitizer_$tool.log | tr '\n' ' ') $(( $(date +%s) - start ))s"
  done
fi

if stage profile; then
  start=$(date +%s)
  IFS='|' read -r -a cases <<< "${PROFILE_CASES:-}"
  ncu --profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats \
    --section Occupancy --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    python3 tools/profile_cases.py "${cases[@]}" > "$OUT/profile.log" 2>&1
  rc=$?
  RESULT[profile]="rc=$rc $(grep -c 'Duration' "$OUT/profile.log") kernels $(( $(date +%s) - start ))s"
fi

if stage timeline; then
  start=$(date +%s)
  IFS='|' read -r -a cases <<< "${TIMELINE_CASES:-}"
  python3 tools/timeline_cases.py "${cases[@]}" >> "$OUT/profile.log" 2>&1
  rc=$?
  RESULT[timeline]="rc=$rc $(grep -c '^==' "$OUT/profile.log") timelines $(( $(date +%s) - start ))s"
fi

if stage bench; then
  start=$(date +%s)
  only_arg=()
  [ -n "$ONLY" ] && only_arg=(--only "$ONLY")
  [ -n "${BENCH_CASES:-}" ] && only_arg+=(--cases "$BENCH_CASES")
  python3 -m baracuda_ops --device cuda $BENCH_ARGS "${only_arg[@]}" --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2>/tmp/bench.err
  rc=$?
  [ $rc -ne 0 ] && tail -20 /tmp/bench.err
  RESULT[bench]="rc=$rc $(( $(date +%s) - start ))s"
  sed -n '/^copy bandwidth/,$p' "$OUT/bench.log"
  grep -E "FAIL" "$OUT/bench.log" | head
fi

echo
echo "== summary ($(head -2 "$OUT/gpu.txt" | tail -1)) =="
printf '%-10s | %s\n' stage result
for k in build test memcheck racecheck initcheck synccheck profile timeline bench; do
  [ -n "${RESULT[$k]:-}" ] && printf '%-10s | %s\n' "$k" "${RESULT[$k]}"
done
