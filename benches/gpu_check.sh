#!/usr/bin/env bash
# The device check of pagedrs (issues 18 and 34), under ten minutes on one GPU:
#
#   bash benches/gpu_dist.sh      # here, with Rust and network: builds dist/
#   bash benches/gpu_check.sh     # there, with dist/ carried along
#
# Steps, in order:
# (a) no CUDA GPU: runs stage (0) alone when pagedrs imports as it is, then prints
#     "gpu_check: no CUDA GPU, skipping the GPU stages (CPU-only machine)" and exits with
#     stage (0)'s status (0 when it did not run). On a GPU: installs, when pagedrs is not
#     importable, the prebuilt abi3 wheel of dist/ with
#     `pip install --no-deps --target .gpu_site` (put on PYTHONPATH), then from
#     dist/deps (no index) each runtime dependency the interpreter lacks; then imports
#     pagedrs, its Rust core and LLM, and exits 1 loudly if any of that fails (a broken
#     or missing wheel).
# (0) benches/triton_aot.py: every Triton kernel compiled ahead of time for sm_80 and
#     sm_90 by triton's own ptxas (no GPU needed), the case set of the CI test
#     (GPU_CHECK_AOT_CASES, default ci; `full` is the whole sweep); fails on a compile
#     error or an attention kernel that spills registers; writes triton_aot.json;
# (b) the Triton kernel tests on the GPU, compiled (TRITON_INTERPRET unset);
# (c) benches/gpu_zoo.py: tiny-model zoo, greedy tokens vs HF on the GPU, with CUDA
#     graphs and eager;
# (d) benches/bench_kernels.py: paged decode attention bandwidth vs HBM peak at 1k-32k
#     contexts, block 16, and vs torch SDPA on contiguous K/V;
# (e) benches/gpu_throughput.py: offline throughput of the Llama-3-8B-shaped model
#     (random weights, load_format="dummy") at 64 and 256 sequences, eager vs CUDA
#     graphs, and the decode step's breakdown (schedule, step arrays, forward, sample);
# (g) the same for Qwen3-8B-shaped and Gemma-3-1B-like hybrid (sliding-window and
#     full-attention layers) models, 32 sequences, CUDA graphs only;
# (f) benches/gpu_check_summary.py: gpu_check.json from (0), (c)-(e) and (g).
# Each stage has a header line and a `timeout`; a failing stage does not stop the
# later ones; a summary comes last, and the exit status is 1 if any stage failed.
# Logs (one per stage) and gpu_check.json go to $GPU_CHECK_OUT, else $OUT, else
# ./gpu_check_out.
#
# Environment (all optional):
#   PYTHON             interpreter (default: the first of python, python3 with torch)
#   GPU_CHECK_DIST     folder of the wheel and deps/ (default: dist/ in the repository)
#   GPU_CHECK_SITE     where installs go, put on PYTHONPATH (default: .gpu_site/)
#   GPU_CHECK_OUT      output folder (see above)
#   GPU_CHECK_STAGES   stages to run, default "0 b c d e g f"
#   GPU_CHECK_AOT_CASES   case set of stage (0): ci (default), heavy or full
#   GPU_CHECK_TIMEOUT_AOT / _TESTS / _ZOO / _KERNELS / _THROUGHPUT / _SHAPES   seconds per stage
#   BENCH_KERNELS_ARGS, GPU_THROUGHPUT_ARGS   extra arguments of (d) and (e)
#   GPU_CHECK_CPU_DRY_RUN=1   rehearse on a CPU: no skip; every stage on tiny sizes
#                             (interpreter, --cpu-dry-run / --cpu-smoke; stage (0)
#                             compiles as it does everywhere); no figures
set -uo pipefail

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

# (a) CPU-only machines run stage (0) only, unless GPU_CHECK_CPU_DRY_RUN=1 (a rehearsal
# of this script: the install path, every stage's code on tiny sizes on the CPU, the
# summary).
DRY="${GPU_CHECK_CPU_DRY_RUN:-0}"
NO_GPU=0
cuda="$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null | tail -n 1 || true)"
if [[ "$DRY" == "1" ]]; then
    echo "gpu_check: CPU DRY RUN (GPU_CHECK_CPU_DRY_RUN=1): tiny sizes, Triton interpreter;"
    echo "  a rehearsal of the script, its figures are no measurement"
    export TRITON_INTERPRET=1
    BUDGET=100000
elif [[ "$cuda" != "True" ]]; then
    NO_GPU=1
else
    unset TRITON_INTERPRET # the kernels are compiled for the GPU, not interpreted
fi

OUTDIR="${GPU_CHECK_OUT:-${OUT:-$ROOT/gpu_check_out}}"
mkdir -p "$OUTDIR"
DIST="${GPU_CHECK_DIST:-$ROOT/dist}"

SUMMARY=()
FAILED=0
STAGES=" ${GPU_CHECK_STAGES:-0 b c d e g f} "

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
    if [[ "$DRY" == "1" || "$NO_GPU" == "1" ]]; then limit=$((limit * 5)); fi # a slow CPU
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
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUTDIR/$id.log"
    rc=${PIPESTATUS[0]}
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

echo "==== gpu_check: environment ===="
echo "repo: $ROOT; python: $(command -v "$PY"); out: $OUTDIR; dist: $DIST"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || true
fi
ldd --version 2>/dev/null | head -n 1 || true
"$PY" - <<'EOF' || true
import platform

import torch

print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if torch.cuda.is_available():
    print(f"device: {torch.cuda.get_device_name()}, {torch.cuda.device_count()} visible")
try:
    import triton
    import transformers

    print(f"triton {triton.__version__}, transformers {transformers.__version__}")
except ImportError as exc:
    print(f"not importable: {exc}")
EOF

# (0) the ahead-of-time compile of every Triton kernel: no GPU needed, so it runs first,
# and alone on a machine without one.
aot_stage() {
    run_stage 0-aot "Triton kernels compiled ahead of time for sm_80 / sm_90 (ptxas spills)" \
        "${GPU_CHECK_TIMEOUT_AOT:-90}" \
        "$PY" benches/triton_aot.py --cases "${GPU_CHECK_AOT_CASES:-ci}" \
        --out "$OUTDIR/triton_aot.json"
}
if ((NO_GPU)); then
    if "$PY" -c "import pagedrs.kernels.aot" >/dev/null 2>&1; then
        aot_stage
    else
        echo "stage (0) not run: pagedrs.kernels.aot does not import with $PY"
    fi
    echo "gpu_check: no CUDA GPU, skipping the GPU stages (CPU-only machine)"
    printf '%s\n' ${SUMMARY[@]+"${SUMMARY[@]}"}
    exit "$FAILED"
fi

# Import name -> distribution name of each runtime dependency gpu_check needs.
DEPS=(typing_extensions:typing-extensions msgspec:msgspec zmq:pyzmq tvm_ffi:apache-tvm-ffi annotated_types:annotated-types
    typing_inspection:typing-inspection pydantic_core:pydantic-core pydantic:pydantic
    xgrammar:xgrammar pluggy:pluggy iniconfig:iniconfig pygments:pygments pytest:pytest)
# Installs go to a folder of their own on PYTHONPATH (pip --target): nothing of the
# machine's environment is replaced, and an externally managed Python is no obstacle.
SITE="${GPU_CHECK_SITE:-$ROOT/.gpu_site}"
use_site() {
    mkdir -p "$SITE"
    case ":${PYTHONPATH:-}:" in
        *":$SITE:"*) ;;
        *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
}
install_missing_deps() {
    local pair mod missing=()
    for pair in "${DEPS[@]}"; do
        mod=${pair%%:*}
        if ! "$PY" -c "import $mod" >/dev/null 2>&1; then missing+=("${pair#*:}"); fi
    done
    if ((${#missing[@]})); then
        use_site
        echo "dependencies missing: ${missing[*]}: pip install --no-index --no-deps --target $SITE from $DIST/deps"
        "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" \
            --find-links "$DIST/deps" "${missing[@]}" ||
            echo "gpu_check: could not install ${missing[*]} from $DIST/deps"
    fi
}
pagedrs_ok() {
    "$PY" -c "import pagedrs, pagedrs._core; from pagedrs import LLM" >/dev/null 2>&1
}
if [[ -d "$SITE" ]]; then use_site; fi # installed by an earlier run
if ! pagedrs_ok; then
    wheel="$(ls "$DIST"/pagedrs-*.whl 2>/dev/null | head -n 1)"
    if ! "$PY" -c "import pagedrs._core" >/dev/null 2>&1; then
        if [[ -z "$wheel" ]]; then
            echo "gpu_check: FAILED: pagedrs is not importable and $DIST holds no pagedrs wheel"
            echo "  (build it where Rust is: bash benches/gpu_dist.sh, and carry dist/)"
            exit 1
        fi
        use_site
        echo "==== pagedrs not importable: pip install --no-deps --target $SITE $wheel ($(cat "$DIST/COMMIT" 2>/dev/null | tr '\n' ' ')) ===="
        "$PY" -m pip install -q --no-deps --upgrade --target "$SITE" "$wheel" ||
            echo "gpu_check: pip install of $wheel failed (rc $?)"
    fi
    install_missing_deps
fi
if ! "$PY" -c "import pytest" >/dev/null 2>&1; then install_missing_deps; fi
if ! "$PY" -c "import pagedrs, pagedrs._core; from pagedrs import LLM; print('pagedrs:', pagedrs.__file__)"; then
    echo "gpu_check: FAILED: pagedrs (its Rust core pagedrs._core, or a dependency) does not"
    echo "  import with $PY; the traceback above says which. Rebuild dist/ with"
    echo "  bash benches/gpu_dist.sh (GPU_PYTHON_VERSION=this Python's) and carry it along."
    exit 1
fi
if "$PY" -c "import sys, fastapi" >/dev/null 2>&1; then :; else
    echo "fastapi: not installed (not needed by these stages)"
fi

read -r -a kernel_args <<<"${BENCH_KERNELS_ARGS:-}"
read -r -a throughput_args <<<"${GPU_THROUGHPUT_ARGS:-}"
test_args=()
zoo_args=()
if [[ "$DRY" == "1" ]]; then
    test_args=(-k "decode_attention_splits and (1-1 or 4-8)")
    zoo_args=(--cpu-dry-run --models llama gemma3_text)
    kernel_args=(--cpu-smoke)
    throughput_args=(--cpu-dry-run)
fi

aot_stage
run_stage b-kernel-tests "Triton kernel tests on the GPU (compiled, no interpreter)" \
    "${GPU_CHECK_TIMEOUT_TESTS:-170}" \
    "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_triton_kernels.py \
    tests/kernels/test_kv_cache_dtypes.py tests/kernels/test_attention_backends.py \
    ${test_args[@]+"${test_args[@]}"}
run_stage c-zoo "tiny-model zoo: greedy tokens vs HF on the GPU, CUDA graphs and eager" \
    "${GPU_CHECK_TIMEOUT_ZOO:-130}" \
    "$PY" benches/gpu_zoo.py --json ${zoo_args[@]+"${zoo_args[@]}"}
run_stage d-kernels "paged decode attention: bandwidth vs HBM peak, vs torch SDPA" \
    "${GPU_CHECK_TIMEOUT_KERNELS:-80}" \
    "$PY" benches/bench_kernels.py --contexts 1024 2048 4096 8192 16384 32768 --json \
    ${kernel_args[@]+"${kernel_args[@]}"}
run_stage e-throughput "Llama-3-8B-shaped offline throughput, eager vs CUDA graphs" \
    "${GPU_CHECK_TIMEOUT_THROUGHPUT:-200}" \
    "$PY" benches/gpu_throughput.py --json ${throughput_args[@]+"${throughput_args[@]}"}
shapes_args=(--num-seqs 32 --prompt-len 128 --output-len 32 --modes cuda_graphs)
if [[ "$DRY" == "1" ]]; then shapes_args=(--cpu-dry-run --modes cuda_graphs); fi
run_stage g-shapes "Qwen3-8B-shaped and Gemma-3-like hybrid (random weights), CUDA graphs" \
    "${GPU_CHECK_TIMEOUT_SHAPES:-100}" \
    bash -c 'for m in qwen3-8b gemma3-1b-like; do "$0" benches/gpu_throughput.py --model "$m" \
        --json "${@}" || exit 1; done' "$PY" "${shapes_args[@]}"
run_stage f-summary "gpu_check.json" 30 \
    "$PY" benches/gpu_check_summary.py "$OUTDIR"

echo
echo "==== gpu_check summary (${SECONDS}s) ===="
printf '%s\n' "${SUMMARY[@]}"
if ((FAILED)); then
    echo "gpu_check: FAILED"
    exit 1
fi
echo "gpu_check: all selected stages passed"
