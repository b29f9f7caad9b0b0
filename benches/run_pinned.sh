#!/bin/bash
# Run a timing measurement on one core: pinned to CPU ${PIN_CPU:-1}, in its
# own session, whose autogroup (kernel.sched_autogroup_enabled=1 puts every
# session in one) gets nice ${AUTOGROUP_NICE:-0} when the user may set it.
# With autogroups a process's own nice value only ranks it within its
# session: against the other sessions' groups it gets an equal share of the
# core at autogroup nice 0 (normal priority), whatever their `nice -n 10`.
# A negative AUTOGROUP_NICE takes the core from the others: only on a machine
# whose users agreed to it. Prints the autogroup, the CPU list and the load
# average to stderr.
#
#   benches/run_pinned.sh python benches/bench_planner.py --mode engine --threads 1 ...
set -euo pipefail
if [ -z "${PAGEDRS_PINNED_SESSION:-}" ]; then
    export PAGEDRS_PINNED_SESSION=1
    exec setsid -w "$0" "$@"
fi
if [ -w /proc/self/autogroup ]; then
    echo "${AUTOGROUP_NICE:-0}" > /proc/self/autogroup 2>/dev/null || true
    echo "run_pinned: $(cat /proc/self/autogroup), cpu ${PIN_CPU:-1}, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
fi
exec taskset -c "${PIN_CPU:-1}" "$@"
