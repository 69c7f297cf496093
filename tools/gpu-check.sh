#!/usr/bin/env bash
# The prepared GPU check: one script for a machine with a GPU but no Rust toolchain and no
# network, run from the repository root, within 8 minutes.
#
#   tools/gpu-check.sh build [BUNDLE]   here (with cargo): build the release wgmoe with
#                                       `--features cuda` and the test binaries the check
#                                       runs, into BUNDLE (default target/gpu-check),
#                                       xz-compressed; with WGMOE_NVRTC_LIB set, that NVRTC
#                                       (and its builtins) goes in too (~31 MB).
#   tools/gpu-check.sh REPORT [BUNDLE]  there: run the checks from BUNDLE, writing logs, the
#                                       bench records and summary.txt into REPORT.
#
# On a lent device machine: build here, then run `tools/gpu-check.sh $OUT/report` there with
# target/gpu-check carried. A run carries the working tree with it, 64 MiB in all: with the
# fixtures under models/ (~90 MB) the tree alone is over, so a run leaves them out (out of
# git's index and excluded for the run, models/configs and models/olmoe-tiny/config.json
# kept) and the bundle holds the fixture-free suites: WGMOE_GPU_SUITES="kernels_dense
# kernels_matvec kernels_moe kernels_attention kernels_dense_gguf kernels_experts_gguf"
# WGMOE_GPU_CUDA_TESTS="cuda_nvrtc cuda_kernels" (about 52 MB with NVRTC, 31 MB of it).
# Vulkan on the H200 image needs the loader and glvnd carried in (.gl/ with the Debian debs
# of libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2, unpacked first with
# `for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig`) and
# VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json.
# Without a GPU, the CUDA branch can be tried on the fake driver of the tests:
#   WGMOE_FAKE_CUDA_OUT=/tmp/fake cargo test --release --features cuda --test cuda_fake_driver
#   LD_LIBRARY_PATH=/tmp/fake tools/gpu-check.sh /tmp/report   # emulated: slow, not a GPU
#
# The checks, correctness first: devices; the Vulkan kernel, parity and GGUF suites where
# a Vulkan adapter is; on an NVIDIA GPU the NVRTC compile test, the CUDA kernel and parity
# tests (tests/cuda_kernels.rs, tests/cuda_parity.rs with WGMOE_REQUIRE_CUDA=1: a missing
# device fails them) and the wgpu suites on CUDA (WGMOE_TEST_BACKEND=cuda); then
# `devices --measure`, decode tok/s of the scaled OLMoE shape (`wgmoe synth`, converted
# INT4) and of Q4_K_M GGUF files of the scaled OLMoE and Qwen3 shapes (`synth --format
# gguf`) on each backend at pipeline depth 1 and 2, `kernels`' latency-aware prediction
# beside them, a per-kernel GPU-time table of the GGUF ones, and a partial residency
# bench on CUDA. Each step has its own time
# limit; a failed step is recorded and the next one runs. Exit status: 0 when every step
# that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Test binaries of the check (tests/<name>.rs), and which of them also run on CUDA.
# (WGMOE_GPU_SUITES / WGMOE_GPU_CUDA_TESTS choose fewer at build time: a run carries at most
# 64 MiB with the working tree, so a tree with the fixtures leaves room for few; the check
# runs the suites its bundle holds.)
SUITES=${WGMOE_GPU_SUITES:-"kernels_dense kernels_matvec kernels_moe kernels_attention kernels_q4 kernels_dense_gguf kernels_experts_gguf parity parity_families gguf_run residency"}
CUDA_TESTS=${WGMOE_GPU_CUDA_TESTS:-"cuda_nvrtc cuda_kernels cuda_parity"}

build() {
  local bundle=${1:-target/gpu-check}
  rm -rf "$bundle" && mkdir -p "$bundle/tests" || exit 1
  cargo build --release --features cuda || exit 1
  local list
  list=$(cargo test --release --features cuda --no-run --message-format=json \
    $(for t in $SUITES $CUDA_TESTS; do printf -- '--test %s ' "$t"; done) 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
') || exit 1
  [ -n "$list" ] || { echo "no test binaries built" >&2; exit 1; }
  # Stripped (symbols are a fifth of a binary), then compressed.
  pack() {
    local tmp="$bundle/.strip"
    cp "$1" "$tmp" && { command -v strip >/dev/null && strip "$tmp" || true; } &&
      xz -T0 -6 -c "$tmp" >"$2" && rm -f "$tmp"
  }
  pack target/release/wgmoe "$bundle/wgmoe.xz" || exit 1
  while read -r name exe; do
    pack "$exe" "$bundle/tests/$name.xz" || exit 1
  done <<<"$list"
  if [ -n "${WGMOE_NVRTC_LIB:-}" ]; then
    mkdir -p "$bundle/nvrtc"
    local dir
    dir=$(dirname "$WGMOE_NVRTC_LIB")
    for f in "$WGMOE_NVRTC_LIB" "$dir"/libnvrtc-builtins.so.*; do
      [ -f "$f" ] && xz -T0 -6 -c "$f" >"$bundle/nvrtc/$(basename "$f").xz"
    done
  fi
  git rev-parse HEAD >"$bundle/commit" 2>/dev/null
  du -sh "$bundle"
}

# xz -d, or Python's lzma where xz is missing.
unxz_to() {
  if command -v xz >/dev/null; then
    xz -dc "$1" >"$2"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  fi
}

START=$(date +%s)
TOTAL_LIMIT=540 # seconds: 9.5 minutes less the unpacking margin
FAILED=0

# step NAME SECONDS COMMAND...: run with a limit (never past the total), log, record.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((TOTAL_LIMIT - ($(date +%s) - START)))
  if [ "$left" -le 5 ]; then
    echo "$name: not run: out of time" | tee -a "$REPORT/summary.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$REPORT/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  local res=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    res="TIMEOUT after ${limit}s"
    FAILED=1
  elif [ "$rc" -ne 0 ]; then
    res="FAILED (exit $rc)"
    FAILED=1
  fi
  local tests
  tests=$(grep -h '^test result:' "$REPORT/$name.log" |
    sed -E 's/^test result: ([A-Za-z]+)\. ([0-9]+) passed; ([0-9]+) failed.*/\2 passed, \3 failed/' | paste -sd'|' -)
  echo "$name: $res in ${dt}s ${tests:+[$tests]}" | tee -a "$REPORT/summary.txt"
}

check() {
  REPORT=$1
  local bundle=${2:-target/gpu-check}
  mkdir -p "$REPORT" || exit 1
  REPORT=$(cd "$REPORT" && pwd)
  : >"$REPORT/summary.txt"
  [ -f "$bundle/wgmoe.xz" ] || { echo "no bundle at $bundle: run \`tools/gpu-check.sh build\` first" >&2; exit 1; }
  local bin="$REPORT/bin"
  mkdir -p "$bin/tests"
  unxz_to "$bundle/wgmoe.xz" "$bin/wgmoe" && chmod +x "$bin/wgmoe" || exit 1
  for f in "$bundle"/tests/*.xz; do
    local n
    n=$(basename "$f" .xz)
    unxz_to "$f" "$bin/tests/$n" && chmod +x "$bin/tests/$n"
  done
  echo "bundle of commit $(cat "$bundle/commit" 2>/dev/null), checked $(date -u +%FT%TZ) on $(hostname)" | tee -a "$REPORT/summary.txt"
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  export WGMOE_REPO_DIR=$ROOT
  # NVRTC: the one named, else the bundled one, else one on the loader path.
  if [ -z "${WGMOE_NVRTC_LIB:-}" ] && ls "$bundle"/nvrtc/libnvrtc.so.*.xz >/dev/null 2>&1; then
    mkdir -p "$bin/nvrtc"
    for f in "$bundle"/nvrtc/*.xz; do unxz_to "$f" "$bin/nvrtc/$(basename "$f" .xz)"; done
    export WGMOE_NVRTC_LIB=$(ls "$bin"/nvrtc/libnvrtc.so.* | grep -v builtins | head -1)
    export LD_LIBRARY_PATH="$bin/nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  echo "WGMOE_NVRTC_LIB=${WGMOE_NVRTC_LIB:-<unset: the loader path>}" >>"$REPORT/summary.txt"
  nvidia-smi >"$REPORT/nvidia-smi.txt" 2>&1

  local W="$bin/wgmoe"
  local B="--prompts 2 --blocks 1 -n 32 --warmup 1"
  # The suites the bundle holds (the CUDA tests run on their own below).
  SUITES=$(cd "$bin/tests" && ls | grep -v '^cuda_' | tr '\n' ' ')
  has() { [ -x "$bin/tests/$1" ]; }
  step devices 30 "$W" devices
  # Correctness first: the kernel, parity and GGUF suites on Vulkan, then on CUDA.
  local vk=0 cu=0
  "$W" devices --backend vulkan >/dev/null 2>&1 && vk=1
  "$W" devices --backend cuda >"$REPORT/devices-cuda.txt" 2>&1 && cu=1
  if [ $vk = 1 ]; then
    step vulkan-suites 200 sh -c "rc=0; for t in $SUITES; do echo \"== \$t\"; '$bin/tests/'\$t --test-threads=4 || rc=1; done; exit \$rc"
  else
    echo "vulkan: not run: no Vulkan adapter" | tee -a "$REPORT/summary.txt"
  fi
  if [ $cu = 1 ]; then
    has cuda_nvrtc && step cuda-nvrtc 60 "$bin/tests/cuda_nvrtc" --nocapture
    has cuda_kernels && step cuda-kernels 60 env WGMOE_REQUIRE_CUDA=1 "$bin/tests/cuda_kernels" --nocapture
    has cuda_parity && step cuda-parity 90 env WGMOE_REQUIRE_CUDA=1 "$bin/tests/cuda_parity" --nocapture
    # The wgpu suites on CUDA: tests forcing kernels CUDA has no version of (uniform
    # windows, subgroups) are refused by the plan and fail; the log says which.
    step cuda-suites 150 sh -c "for t in $SUITES; do echo \"== \$t\"; WGMOE_TEST_BACKEND=cuda '$bin/tests/'\$t --test-threads=4; done; true"
    grep -h '^test .* FAILED$\|^test result' "$REPORT/cuda-suites.log" >"$REPORT/cuda-suites-failures.txt" 2>/dev/null
  else
    echo "cuda: not run: $(tail -1 "$REPORT/devices-cuda.txt")" | tee -a "$REPORT/summary.txt"
    # An NVIDIA GPU the CUDA backend cannot open is a failure of the check, not a skip.
    if nvidia-smi -L >/dev/null 2>&1; then
      echo "cuda: FAILED: nvidia-smi lists a GPU" | tee -a "$REPORT/summary.txt"
      FAILED=1
    fi
  fi
  # Then measurements: the device's read bandwidth (the figure achieved rates are compared
  # with) and the scaled OLMoE and Qwen3 shapes (random weights, every expert resident):
  # wgmoe's converted INT4, and Q4_K_M GGUF files (the K-quant kernels: Q4_K, and Q6_K on
  # the layers llama-quantize gives more bits), the Qwen3 one with the real expert width.
  # Per backend: the read bandwidth, the latency of a chain of dependent dispatches and the
  # submit-to-readback round trip (`kernels` below predicts from them).
  [ $vk = 1 ] && step vulkan-devices-measure 60 sh -c "'$W' devices --measure --backend vulkan --json >'$REPORT/measure-vulkan.json'"
  [ $cu = 1 ] && step cuda-devices-measure 60 sh -c "'$W' devices --measure --backend cuda --json >'$REPORT/measure-cuda.json'"
  local SYN="$REPORT/synth"
  step synth-olmoe 60 "$W" synth --arch olmoe-1b-7b --hidden 1024 --layers 8 --heads 16 --experts 64 \
    --top-k 8 --expert-intermediate 512 --vocab 50304 -o "$SYN/olmoe-scaled"
  step synth-olmoe-gguf 60 "$W" synth --arch olmoe-1b-7b --hidden 1024 --layers 8 --heads 16 --experts 64 \
    --top-k 8 --expert-intermediate 512 --vocab 50304 --format gguf -o "$SYN/olmoe-gguf"
  step synth-qwen3-gguf 60 "$W" synth --arch qwen3-30b-a3b --hidden 2048 --layers 8 --heads 32 --kv-heads 4 \
    --head-dim 128 --experts 128 --top-k 8 --expert-intermediate 768 --vocab 32768 --format gguf -o "$SYN/qwen3-gguf"
  # scaled BACKEND: decode tok/s of each model at pipeline depth 1 (the host reads each
  # token before the next step is recorded) and 2 (the default), side by side in one
  # bench; `kernels`' prediction of the Qwen3 shape from this backend's measured bandwidth,
  # dispatch latency and round trip (its probe build needs lavapipe: where the image has
  # none the step fails and says so); and for the GGUF ones the GPU time of each stage and
  # kernel of a decode step and the GPU's busy fraction (`run --profile-kernels`: GPU
  # timestamps where the adapter has them, timing events on CUDA; the table is in the log).
  scaled() {
    local b=$1 m
    for m in olmoe-scaled olmoe-gguf qwen3-gguf; do
      [ -d "$SYN/$m" ] || continue
      step "$b-bench-$m" 90 "$W" bench "$SYN/$m" --backend "$b" $B --pipeline-depths 1,2 --json-out "$REPORT/bench-$b-$m.json"
    done
    if [ -f "$REPORT/measure-$b.json" ] && [ -d "$SYN/qwen3-gguf" ]; then
      local fig
      fig=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
lat = m.get("dispatch_latency_s") or 10e-6
rt = m.get("round_trip_s") or 50e-6
bw = m["device_read_gbps"]
print(f"--bandwidth {bw:.1f} --dispatch-latency-us {lat * 1e6:.2f} --round-trip-us {rt * 1e6:.2f}")
' "$REPORT/measure-$b.json")
      for d in 1 2; do
        step "$b-kernels-qwen3-depth$d" 120 "$W" kernels "$SYN/qwen3-gguf/model.gguf" --stages decode \
          -c 256 $fig --pipeline-depth $d --json
      done
    fi
    for m in olmoe-gguf qwen3-gguf; do
      [ -d "$SYN/$m" ] || continue
      step "$b-profile-$m" 60 sh -c "'$W' run '$SYN/$m' --backend $b -p 'The capital of France is' -n 8 --profile-kernels --json >'$REPORT/profile-$b-$m.json'"
    done
  }
  [ $vk = 1 ] && scaled vulkan
  [ $cu = 1 ] && scaled cuda
  if [ $cu = 1 ] && [ -d models/qwen2moe-tiny ]; then
    step cuda-bench-partial 40 "$W" bench models/qwen2moe-tiny --backend cuda $B --resident-experts 3,6 --json-out "$REPORT/bench-cuda-partial.json"
  fi
  echo "total $(($(date +%s) - START))s" | tee -a "$REPORT/summary.txt"
  rm -rf "$bin" "$SYN"
  exit $FAILED
}

case "${1:-}" in
  build) shift; build "$@" ;;
  "" | -h | --help) sed -n '2,25p' "$0"; exit 2 ;;
  *) check "$@" ;;
esac
