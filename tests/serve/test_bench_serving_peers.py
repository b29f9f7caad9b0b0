"""``benches/bench_serving_peers.py``'s pure logic: reading a ``vllm bench
serve`` result, the highest rate under the TPOT bound, the prompt count per
rate and the servers' command lines."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
import bench_serving_peers as peers  # noqa: E402


def vllm_result(rate: Any, tpot_p90: float, output_lens: list[int], failed: int = 0) -> dict:
    """A ``vllm bench serve --save-result --save-detailed`` object with the
    fields the flags of the benchmark produce (vLLM 0.33's names)."""
    n = len(output_lens)
    return {
        "request_rate": rate,
        "num_prompts": n,
        "completed": n - failed,
        "failed": failed,
        "duration": 40.0,
        "request_throughput": 0.4,
        "output_throughput": 51.2,
        "mean_tpot_ms": tpot_p90 - 20.0,
        "p50_ttft_ms": 900.0,
        "p90_ttft_ms": 1500.0,
        "p50_tpot_ms": tpot_p90 - 30.0,
        "p90_tpot_ms": tpot_p90,
        "p50_itl_ms": 120.0,
        "p90_itl_ms": 400.0,
        "input_lens": [256, 257, 256][:n] + [256] * max(0, n - 3),
        "output_lens": output_lens,
    }


def point(rate: Any, tpot_p90: float, output_lens: list[int] | None = None, failed: int = 0):
    return peers.parse_vllm_result(vllm_result(rate, tpot_p90, output_lens or [128] * 4, failed))


def test_parse_vllm_result_reads_the_percentiles_and_token_counts() -> None:
    p = point(0.25, 180.0, [128, 128, 127, 128])
    assert p["request_rate"] == 0.25
    assert (p["num_prompts"], p["completed"], p["failed"]) == (4, 4, 0)
    assert (p["tpot_p50_ms"], p["tpot_p90_ms"], p["tpot_mean_ms"]) == (150.0, 180.0, 160.0)
    assert (p["ttft_p50_ms"], p["ttft_p90_ms"]) == (900.0, 1500.0)
    assert (p["itl_p50_ms"], p["itl_p90_ms"]) == (120.0, 400.0)
    assert (p["input_len_min"], p["input_len_max"]) == (256, 257)
    assert (p["output_len_min"], p["output_len_max"]) == (127, 128)
    assert (p["output_throughput"], p["request_throughput"]) == (51.2, 0.4)
    assert math.isinf(point("inf", 300.0)["request_rate"])


def test_parse_vllm_result_needs_the_percentile_fields() -> None:
    result = vllm_result(0.1, 100.0, [128])
    del result["p90_tpot_ms"]
    with pytest.raises(KeyError):
        peers.parse_vllm_result(result)


def test_highest_rate_under_is_the_last_passing_rate_before_the_first_failure() -> None:
    points = [point(0.3, 230.0), point(0.1, 120.0), point(0.2, 190.0), point("inf", 900.0)]
    assert peers.highest_rate_under(points, 128, 200.0) == 0.2
    # a rate past a failing one does not count, even when under the bound
    points.append(point(0.35, 199.0))
    assert peers.highest_rate_under(points, 128, 200.0) == 0.2
    # the bound is strict
    assert peers.highest_rate_under([point(0.1, 200.0)], 128, 200.0) == 0.0
    assert peers.highest_rate_under([], 128, 200.0) == 0.0


def test_a_short_output_or_a_failed_request_fails_the_point() -> None:
    short = point(0.1, 100.0, [128, 128, 127, 128])
    assert not peers.point_ok(short, 128, 200.0)
    assert peers.highest_rate_under([short], 128, 200.0) == 0.0
    failed = point(0.1, 100.0, failed=1)
    assert not peers.point_ok(failed, 128, 200.0)
    assert peers.point_ok(point(0.1, 100.0), 128, 200.0)


def test_prompts_for_rate_spans_the_seconds_within_the_bounds() -> None:
    assert peers.prompts_for_rate(0.2, 150.0, 16, 64) == 30
    assert peers.prompts_for_rate(0.05, 150.0, 16, 64) == 16
    assert peers.prompts_for_rate(1.0, 150.0, 16, 64) == 64


def test_server_commands_pin_threads_slots_and_context() -> None:
    model = Path("/m/file.gguf")
    llama = peers.server_command("llama.cpp", model, 8000, 1, 24, 400, Path("/b/llama-server"))
    assert llama[0] == "/b/llama-server"

    def value(cmd: list[str], flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert [value(llama, f) for f in ("-t", "-tb", "--parallel", "-c")] == ["1", "1", "24", "9600"]
    assert "--cont-batching" in llama
    ours = peers.server_command("pagedrs", model, 8000, 2, 24, 400, None)
    assert [value(ours, f) for f in ("--torch-threads", "--max-model-len")] == ["2", "400"]
    with pytest.raises(ValueError, match="--llama-server"):
        peers.server_command("llama.cpp", model, 8000, 1, 24, 400, None)
    with pytest.raises(ValueError, match="unknown engine"):
        peers.server_command("other", model, 8000, 1, 24, 400, None)


LLAMA_LOG = """\
0.03.616.729 I slot print_timing: id  1 | task 0 | prompt eval time =     188.04 ms /   256 tokens (   94.02 ms per token,    10.64 tokens per second)
0.03.616.769 I slot print_timing: id  1 | task 0 |        eval time =     272.98 ms /   128 tokens (   54.60 ms per token,    18.32 tokens per second)
0.03.616.781 I slot print_timing: id  1 | task 0 |       total time =     461.02 ms /   384 tokens
0.05.100.000 I slot print_timing: id  0 | task 2 | prompt eval time =      20.00 ms /     1 tokens (   20.00 ms per token,    50.00 tokens per second)
0.05.200.000 I slot print_timing: id  0 | task 2 |        eval time =     300.00 ms /   127 tokens (    2.36 ms per token,   423.33 tokens per second)
"""  # noqa: E501


def test_llama_server_counts_reads_prompt_and_generated_tokens() -> None:
    assert peers.llama_server_counts(LLAMA_LOG) == ([256, 1], [128, 127])


def test_server_output_counts_recompute_tpot_as_vllm_does() -> None:
    result = vllm_result(0.1, 500.0, [50, 60, 70])  # the client's re-tokenized counts
    result["errors"] = ["", "", ""]
    result["ttfts"] = [1.0, 2.0, 3.0]
    result["latencies"] = [1.0 + 127 * 0.1, 2.0 + 127 * 0.2, 3.0 + 127 * 0.3]
    p = peers.parse_vllm_result(result, [128, 128, 128])
    assert p["output_lens_source"] == "server"
    assert (p["output_len_min"], p["output_len_max"]) == (128, 128)
    assert (p["client_output_len_min"], p["client_output_len_max"]) == (50, 70)
    assert p["client_tpot_p90_ms"] == 500.0
    # per-request TPOT 100, 200, 300 ms: numpy's linear percentiles
    assert p["tpot_p50_ms"] == pytest.approx(200.0)
    assert p["tpot_p90_ms"] == pytest.approx(280.0)
    assert p["tpot_mean_ms"] == pytest.approx(200.0)
    assert p["output_throughput"] == pytest.approx(3 * 128 / 40.0)
    with pytest.raises(ValueError, match="2 output counts for 3"):
        peers.parse_vllm_result(result, [128, 128])
