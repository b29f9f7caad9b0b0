"""Bad traces, profiles and settings give errors naming the line or field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagedrs.plan import PlanConfig, load_profile, read_jsonl_trace
from pagedrs.plan.cli import main as plan_main
from pagedrs.plan.hardware import PROFILE_DIR, HardwareProfile


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD = '{"prompt_len": 20, "output_len": 5, "arrival_s": 0.0}'


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a request is a JSON object"),
        ('{"prompt_len": 20, "arrival_s": 1.0}', "line 2: missing field 'output_len'"),
        ('{"prompt_len": 0, "output_len": 3, "arrival_s": 1}', "line 2: field 'prompt_len'"),
        ('{"prompt_len": 5, "output_len": 2.5, "arrival_s": 1}', "line 2: field 'output_len'"),
        ('{"output_len": 3, "arrival_s": 1}', "line 2: missing field 'prompt_len'"),
        ('{"prompt_len": 5, "output_len": 3}', "line 2: field 'arrival_s' must be on every line"),
        ('{"prompt_len": 5, "output_len": 3, "arrival_s": -1}', "line 2: field 'arrival_s'"),
        ('{"prompt_len": 5, "output_len": 3, "arrival_s": 1, "x": 1}', "line 2: unknown field 'x'"),
        (
            '{"prompt_token_ids": [1, -2], "output_len": 3, "arrival_s": 1}',
            "line 2: field 'prompt_token_ids'",
        ),
        (
            '{"prompt_len": 5, "output_len": 3, "arrival_s": 1, "prefix_group": "a", '
            '"prefix_len": 9}',
            "line 2: field 'prefix_len' (9) exceeds 'prompt_len' (5)",
        ),
    ],
)
def test_bad_trace_line_is_named(tmp_path: Path, bad: str, needle: str) -> None:
    p = _write(tmp_path, [GOOD, bad])
    with pytest.raises(ValueError) as e:
        read_jsonl_trace(p)
    assert needle in str(e.value)
    assert str(p) in str(e.value)


def test_arrivals_out_of_order_named(tmp_path: Path) -> None:
    p = _write(tmp_path, [GOOD.replace("0.0", "2.0"), GOOD])
    with pytest.raises(ValueError, match="line 2: field 'arrival_s' .* earlier"):
        read_jsonl_trace(p)


def test_good_trace_shares_prefixes(tmp_path: Path) -> None:
    lines = [
        json.dumps({"prompt_len": 40, "output_len": 4, "prefix_group": "sys", "prefix_len": 32}),
        json.dumps({"prompt_len": 50, "output_len": 6, "prefix_group": "sys", "prefix_len": 32}),
        json.dumps({"prompt_token_ids": [5, 6, 7], "output_len": 2}),
    ]
    tr = read_jsonl_trace(_write(tmp_path, lines))
    assert not tr.timed
    a, b, c = tr.requests
    assert (a.prompt[:32] == b.prompt[:32]).all() and (a.prompt[32:40] != b.prompt[32:40]).any()
    assert c.prompt.tolist() == [5, 6, 7] and (b.output_len, len(b.prompt)) == (6, 50)


def _profile_dict() -> dict:
    return json.loads((PROFILE_DIR / "h100.json").read_text())


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.pop("memory_bandwidth_Bps"), "missing field 'memory_bandwidth_Bps'"),
        (lambda d: d.update(memory_bytes="80GB"), "field 'memory_bytes' must be a number"),
        (lambda d: d["efficiency"].update(matmul=1.5), "field 'efficiency.matmul'"),
        (lambda d: d["efficiency"].pop("memory"), "missing field 'efficiency.memory'"),
        (lambda d: d["efficiency"].update(disk=0.5), "unknown field 'efficiency.disk'"),
        (lambda d: d.update(combine="avg"), "field 'combine'"),
        (lambda d: d.update(peak_flop=1), "unknown field 'peak_flop'"),
        (lambda d: d["peak_flops"].update(bfloat16=-1), "field 'peak_flops.bfloat16'"),
        (lambda d: d.update(multi_token_s=-0.1), "field 'multi_token_s'"),
        (lambda d: d.update(few_token_s=[0.1]), "field 'few_token_s' must be an object"),
        (lambda d: d.update(few_token_s={"12": 0.1}), "key '12' is not a count 2-8"),
        (lambda d: d.update(few_token_s={"3": "fast"}), "field 'few_token_s.3'"),
        (lambda d: d.update(matmul_knee_tokens=-4), "field 'matmul_knee_tokens' must be >= 0"),
        (lambda d: d.update(matmul_knee_tokens="8"), "field 'matmul_knee_tokens' must be a num"),
    ],
)
def test_bad_profile_field_is_named(tmp_path: Path, edit, needle: str) -> None:  # noqa: ANN001
    d = _profile_dict()
    edit(d)
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        load_profile(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_profile_json_syntax_error_names_line(tmp_path: Path) -> None:
    p = tmp_path / "gpu.json"
    p.write_text('{\n  "name": "x",\n  oops\n}')
    with pytest.raises(ValueError, match="line 3"):
        load_profile(p)


def test_packaged_profiles_load_and_roundtrip() -> None:
    for name in ("a100-80g", "h100", "h200"):
        prof = load_profile(name)
        assert HardwareProfile.from_dict(prof.as_dict()) == prof
        assert prof.combine == "max" and all(0 < v <= 1 for v in prof.efficiency.values() if v)
    with pytest.raises(ValueError, match="unknown hardware profile 'tpu'"):
        load_profile("tpu")


def test_profile_without_dtype_rate() -> None:
    from pagedrs.plan import StepTimeModel, resolve_model_shape

    with pytest.raises(ValueError, match="peak_flops has no 'fp8'"):
        StepTimeModel(resolve_model_shape("opt-13b"), load_profile("a100-80g"), dtype="fp8")


def test_bad_settings_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="router must be one of"):
        PlanConfig(router="random")
    trace = _write(tmp_path, [GOOD])
    rc = plan_main(["--trace", str(trace), "--block-size", "16,x"])
    assert rc == 2 and "--block-size: 'x' is not an integer" in capsys.readouterr().err
    rc = plan_main(["--trace", str(trace), "--request-rates", "0"])
    assert rc == 2 and "--request-rates" in capsys.readouterr().err
    rc = plan_main(["--trace", str(trace), "--allocation-policy", "orca"])
    assert rc == 2 and "allocation_policy must be one of" in capsys.readouterr().err
