"""Hand-typed figures of docs/lora.md: those that come from
``benches/results/*.json`` equal the JSON's value at the precision printed (the
tables under ``<!-- bench: -->`` markers are generated), and those that come from
the default model's shapes (the adapters' reserved bytes, the base weights' bytes)
equal what its config gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from pagedrs.lora.memory import lora_reserved_bytes

ROOT = Path(__file__).resolve().parents[2]


def _results(name: str) -> Any:
    return json.loads((ROOT / "benches" / "results" / name).read_text())


def _assert_says(page: str, *figures: str) -> None:
    text = " ".join((ROOT / page).read_text().split())  # line breaks as spaces
    missing = [f for f in figures if f not in text]
    assert not missing, f"{page} does not say {missing} (its results file does)"


def test_lora_throughput_prose() -> None:
    run = _results("lora_zen4_2026-12-05.json")
    args, rows = run["args"], run["rows"]
    ranks, distinct = args["ranks"], args["distinct"]
    assert args["targets"] == "q_proj,v_proj"
    slot_bytes = {r["rank"]: r["lora_slot_bytes"] for r in rows}  # max(distinct) slots
    per_adapter = slot_bytes[16] / max(distinct)
    _assert_says(
        "docs/lora.md",
        f"`benches/bench_lora.py --reps {args['reps']} --max-tokens {args['max_tokens']}`: "
        f"{args['prompts']} sequences (Alpaca prompts as chats, {args['max_tokens']} greedy "
        f"tokens each, median of {args['reps']} runs,",
        "adapters on `q_proj` and `v_proj` at ranks "
        f"{', '.join(map(str, ranks[:-1]))} and {ranks[-1]}",
        f"`D` = {', '.join(map(str, distinct))} distinct adapters",
        "Measured on an AMD EPYC Zen 4 (family 25 model 17, AVX-512, no AMX)",
        f"one rank-16 adapter holds {per_adapter / 1e6:.1f} MB, so {max(distinct)} distinct "
        f"ones read {slot_bytes[16] / 1e6:.0f} MB a decode step",
        f"(rank 64: {slot_bytes[64] / 1e6:.0f} MB)",
    )
    assert run["cpu"].startswith("AMD EPYC Zen 4 (family 25 model 17), AVX-512, no AMX")


def test_lora_adapter_shape_prose() -> None:
    """The shapes docs/lora.md gives for the default model's adapted projections
    account for the slots' bytes the JSON holds: float32, ``r * (in + out)`` per
    projection and layer, ``max(distinct)`` slots."""
    run = _results("lora_zen4_2026-12-05.json")
    layers, (q_in, q_out), (v_in, v_out) = 30, (576, 576), (576, 192)
    _assert_says(
        "docs/lora.md",
        f"({layers} layers, `q_proj` {q_in}->{q_out}, `v_proj` {v_in}->{v_out})",
    )
    slots = max(run["args"]["distinct"])
    for row in run["rows"]:
        floats = row["rank"] * layers * (q_in + q_out + v_in + v_out)
        assert row["lora_slot_bytes"] == 4 * slots * floats, row


def test_lora_model_bytes_prose(default_model_dir: Path) -> None:
    """The bytes docs/lora.md gives from the default model's config: the adapters'
    reserved bound (``lora_reserved_bytes``, rank 16, one slot and one loaded
    adapter) and the base model's float32 weights, in MB (10^6 bytes) as printed.
    The model is built on the meta device: shapes only, no weights read."""
    config = transformers.AutoConfig.from_pretrained(default_model_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    reserved = lora_reserved_bytes(model, max_loras=1, max_lora_rank=16, max_cpu_loras=1)
    weights = 4 * sum(p.numel() for p in model.parameters())  # tied LM head counted once
    attn = model.get_decoder().layers[0].self_attn
    q, v = attn.q_proj, attn.v_proj
    _assert_says(
        "docs/lora.md",
        f"({config.num_hidden_layers} layers, `q_proj` {q.in_features}->{q.out_features}, "
        f"`v_proj` {v.in_features}->{v.out_features})",
        f"(the default model, rank 16, one slot and one loaded adapter: {reserved / 1e6:.0f} MB)",
        f"beside the base model's {weights / 1e6:.0f} MB of float32 weights",
    )
