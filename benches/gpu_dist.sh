#!/usr/bin/env bash
# Builds dist/, what benches/gpu_check.sh installs on a GPU machine that has
# torch, triton and transformers but no Rust toolchain and no network:
#
#   dist/pagedrs-*-cp310-abi3-*.whl  pagedrs (`maturin build --release`): one wheel
#                                    for every CPython >= 3.10
#   dist/deps/*.whl                  runtime dependencies a bare torch + transformers
#                                    environment lacks (msgspec, pyzmq, xgrammar with
#                                    apache-tvm-ffi and pydantic) and pytest for the
#                                    kernel tests, for CPython $GPU_PYTHON_VERSION, at
#                                    the versions installed here
#   dist/COMMIT                      the commit the wheel was built from
#
#   bash benches/gpu_dist.sh          # then carry dist/ with the working tree
#
# Environment: PYTHON (default python), MATURIN (default maturin), GPU_PYTHON_VERSION (default 3.12),
# GPU_DIST (default dist/ in the repository).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
VERSION="${GPU_PYTHON_VERSION:-3.12}"
DIST="${GPU_DIST:-$ROOT/dist}"

mkdir -p "$DIST/deps"
rm -f "$DIST"/pagedrs-*.whl
"${MATURIN:-maturin}" build --release -o "$DIST" 2>&1 | tail -n 2
{
    git rev-parse HEAD
    if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then echo "dirty"; fi
} >"$DIST/COMMIT"

# Distribution names (pip) of the dependencies, pinned to the versions here.
DEPS=(msgspec pyzmq xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types typing-extensions
    typing-inspection pytest pluggy iniconfig pygments)
pins=()
for dep in "${DEPS[@]}"; do
    pins+=("$dep==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$dep")")
done
rm -f "$DIST"/deps/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIST/deps" "${pins[@]}"

echo "dist: $DIST ($(cat "$DIST/COMMIT" | tr '\n' ' '))"
ls -l "$DIST" "$DIST/deps" | grep -v '^total'
du -sh "$DIST"
