#!/usr/bin/env bash
# Builds llama.cpp's CPU programs from the llama.cpp sources vendored in PyPI's
# `llama-cpp-python` sdist, for tools/make_gguf_fixtures.py.
#
#   tools/build_llamacpp.sh [WORK_DIR]      # default: .llamacpp/ in the repository root
#
# Leaves WORK_DIR/llama.cpp (sources, convert_hf_to_gguf.py, gguf-py) and
# WORK_DIR/llama.cpp/build/bin/{llama-quantize,llama-tokenize} and the static libllama/libggml
# that tools/llamacpp_logits.cpp links against.
# ~15 min on 2 cores. Needs python3 with pip (for `pip download`), cmake and a C++ compiler
# (`pip install cmake ninja` gives the first two).
#
# GGML_NATIVE=OFF with an explicit AVX2/FMA/F16C set: a native build (the default) segfaults on
# quantised tensors on the machines this project runs on.
set -euo pipefail

VERSION=0.3.36
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$REPO/.llamacpp}"
PY="${PYTHON:-python3}"
mkdir -p "$WORK"
cd "$WORK"

SDIST="llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d .
fi
if [ ! -f llama.cpp/CMakeLists.txt ]; then
    rm -rf "llama_cpp_python-$VERSION" llama.cpp
    tar xzf "$SDIST"
    mv "llama_cpp_python-$VERSION/vendor/llama.cpp" llama.cpp
    rm -rf "llama_cpp_python-$VERSION"
fi

cd llama.cpp
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build build --config Release -j "${JOBS:-2}" \
    --target llama-quantize llama-tokenize llama-simple
echo "llama.cpp $VERSION (llama-cpp-python sdist) built in $WORK/llama.cpp/build/bin"
