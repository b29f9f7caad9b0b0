"""Hybrid KV cache: layers grouped by sliding window into KV cache groups that
share one paged pool, sliding-window groups holding only their window's blocks.

The grouping rule (vLLM v1's) on Gemma-3-, Gemma-2-like and uniform layer
patterns; each layer's window as transformers' attention modules really pass
it, for every supported type with windows; and tiny random Gemma 3 (5:1),
Gemma 2 (1:1) and Mistral (sliding only) models generating exactly what HF's
eager attention generates from prompts several windows long: greedy, under
preemption (swap and recompute), with n > 1, with beam search, with and
without prefix caching, while the sliding groups' blocks stay bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from pagedrs import LLM, BeamSearchParams, LLMEngine, SamplingParams
from pagedrs.attention.forward_context import ForwardContext, set_forward_context
from pagedrs.attention.hf_attention import ATTN_IMPLEMENTATION, paged_attention_forward, register
from pagedrs.engine.arg_utils import EngineArgs
from pagedrs.executor.kv_cache import (
    KVCacheGroupSpec,
    KVCacheSpec,
    kv_cache_groups,
    layer_sliding_windows,
)
from reference import PROMPTS, hf_beams, hf_greedy
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

# ----------------------------------------------------------------- grouping


def _gemma3_windows(num_layers: int, window: int, pattern: int = 6) -> list[int | None]:
    return [None if (i + 1) % pattern == 0 else window for i in range(num_layers)]


def _padding(groups: tuple[KVCacheGroupSpec, ...]) -> int:
    size = max(len(g.layers) for g in groups)
    return sum(size - len(g.layers) for g in groups)


def _check_partition(groups: tuple[KVCacheGroupSpec, ...], windows: list[int | None]) -> None:
    """Every layer once, in a group of its own window, in layer order."""
    assert sorted(layer for g in groups for layer in g.layers) == list(range(len(windows)))
    for g in groups:
        assert list(g.layers) == sorted(g.layers)
        assert {windows[layer] for layer in g.layers} == {g.sliding_window}
    keys = [(g.sliding_window is not None, g.sliding_window or 0, g.layers[0]) for g in groups]
    assert keys == sorted(keys)  # full first, then by window, then by first layer


def test_gemma3_1b_like_groups() -> None:
    """26 layers, 5 sliding to 1 full: 4 full, 22 sliding; gs = 4 pads 2
    layers (<= 10%), so 1 full group and 6 sliding groups of up to 4."""
    config = AutoConfig.for_model(
        "gemma3_text", num_hidden_layers=26, sliding_window=512, sliding_window_pattern=6
    )
    windows = layer_sliding_windows(config)
    assert windows == _gemma3_windows(26, 512)
    spec = KVCacheSpec.from_config(config, 16, torch.bfloat16)
    _check_partition(spec.groups, windows)
    assert spec.groups[0] == KVCacheGroupSpec(None, (5, 11, 17, 23))
    assert [g.layers for g in spec.groups[1:]] == [
        (0, 1, 2, 3),
        (4, 6, 7, 8),
        (9, 10, 12, 13),
        (14, 15, 16, 18),
        (19, 20, 21, 22),
        (24, 25),
    ]
    assert spec.group_size == 4 and _padding(spec.groups) == 2
    assert spec.sliding_windows == [None] + [512] * 6
    heads, dim = config.num_key_value_heads, config.head_dim
    assert spec.bytes_per_block == 2 * 4 * heads * 16 * dim * 2


def test_gemma3_27b_like_groups() -> None:
    """62 layers: 10 full, 52 sliding; gs 10..7 pad too much, gs = 6 pads 4."""
    windows = _gemma3_windows(62, 1024)
    groups = kv_cache_groups(windows)
    _check_partition(groups, windows)
    assert max(len(g.layers) for g in groups) == 6 and _padding(groups) == 4
    assert [len(g.layers) for g in groups if g.sliding_window is None] == [6, 4]
    assert [len(g.layers) for g in groups if g.sliding_window] == [6] * 8 + [4]


def test_gemma2_alternating_groups() -> None:
    config = AutoConfig.for_model("gemma2", num_hidden_layers=26, sliding_window=4096)
    spec = KVCacheSpec.from_config(config, 16, torch.float32)
    assert spec.groups == (
        KVCacheGroupSpec(None, tuple(range(1, 26, 2))),
        KVCacheGroupSpec(4096, tuple(range(0, 26, 2))),
    )
    assert spec.group_size == 13 and spec.layer_groups[:4] == (1, 0, 1, 0)
    assert spec.layer_slots[:4] == (0, 0, 1, 1)


def test_one_type_is_one_group_of_all_layers() -> None:
    llama = AutoConfig.for_model("llama", num_hidden_layers=5)
    spec = KVCacheSpec.from_config(llama, 16, torch.float32)
    assert spec.groups == (KVCacheGroupSpec(None, tuple(range(5))),)
    # Exactly the layout before groups: one pair per layer, same bytes.
    assert spec == KVCacheSpec(5, spec.num_kv_heads, spec.head_dim, 16, torch.float32)
    assert spec.bytes_per_block == 2 * 5 * spec.num_kv_heads * 16 * spec.head_dim * 4
    mistral = AutoConfig.for_model("mistral", num_hidden_layers=3, sliding_window=64)
    sliding = KVCacheSpec.from_config(mistral, 16, torch.float32)
    assert sliding.groups == (KVCacheGroupSpec(64, (0, 1, 2)),)


def test_hybrid_false_is_one_full_group() -> None:
    config = AutoConfig.for_model("gemma3_text", num_hidden_layers=12, sliding_window=32)
    spec = KVCacheSpec.from_config(config, 16, torch.float32, hybrid=False)
    assert spec.groups == (KVCacheGroupSpec(None, tuple(range(12))),)
    assert kv_cache_groups([8, None, 8], hybrid=False) == (KVCacheGroupSpec(None, (0, 1, 2)),)
    mistral = AutoConfig.for_model("mistral", num_hidden_layers=2, sliding_window=64)
    assert KVCacheSpec.from_config(mistral, 16, torch.float32, hybrid=False).sliding_windows == [
        None
    ]


def test_three_types_and_uneven_counts() -> None:
    windows = [None, 4, 4, 8, 4, 8, 4, 4, 8, 4]  # 1 full, 6 of window 4, 3 of 8
    groups = kv_cache_groups(windows)
    _check_partition(groups, windows)
    assert max(len(g.layers) for g in groups) == 1  # min count 1: gs = 1
    windows = [None] * 4 + [16] * 6  # 4 and 6: gs 4 pads 2 (> 1), gs 3 pads 2, gs 2 none
    groups = kv_cache_groups(windows)
    assert max(len(g.layers) for g in groups) == 2 and _padding(groups) == 0


def test_layer_caches_share_the_pool() -> None:
    spec = KVCacheSpec(4, 2, 8, 4, torch.float32, kv_cache_groups([None, 8, None, 8]))
    pool = spec.allocate(5, torch.device("cpu"))
    assert len(pool) == spec.group_size == 2
    per_layer = spec.layer_caches(pool)
    # The k-th layer of every group uses pair k.
    assert [id(p) for p in per_layer] == [id(pool[0]), id(pool[0]), id(pool[1]), id(pool[1])]
    assert spec.layer_groups == (0, 1, 0, 1)
    assert pool[0][0].shape == (5, 2, 4, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_pool_starts_zeroed_over_freed_memory(dtype: torch.dtype) -> None:
    """Every pool byte is zero, even where the allocator would hand back freed
    memory full of NaN bit patterns: the torch path multiplies slots past a
    sequence's end by zero weights, and 0 * NaN would poison its output."""
    # 30 layers x 2 tensors of ~1 MB each (a pool over 64 MB in all): sizes the
    # allocator serves from memory it has seen freed.
    spec = KVCacheSpec(30, 2, 64, 16, dtype, kv_cache_groups([None] * 30))
    num_blocks = (80 << 20) // spec.bytes_per_block
    nbytes = num_blocks * spec.bytes_per_block // (2 * spec.group_size)
    garbage = [torch.full((nbytes,), 255, dtype=torch.uint8) for _ in range(2 * spec.group_size)]
    del garbage
    pool = spec.allocate(num_blocks, torch.device("cpu"))
    for key_cache, value_cache in pool:
        for cache in (key_cache, value_cache):
            assert cache.dtype == dtype and cache.is_contiguous()
            assert not cache.view(torch.uint8).any()
    pool[0][0][3].fill_(1.0)  # writable, in place
    assert spec.layer_caches(pool)[0][0][3].eq(1.0).all()


@pytest.mark.parametrize(
    "groups",
    [
        (KVCacheGroupSpec(None, (0, 1)),),  # layer 2 missing
        (KVCacheGroupSpec(None, (0, 1, 2)), KVCacheGroupSpec(8, (2,))),  # layer 2 twice
    ],
)
def test_groups_must_partition_the_layers(groups) -> None:
    with pytest.raises(ValueError, match="each of the 3 layers once"):
        KVCacheSpec(3, 2, 8, 4, torch.float32, groups)


def test_group_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        KVCacheGroupSpec(0, (0,))


# ------------------------------------- windows as transformers' modules apply them

_TINY: dict[str, Any] = {
    "vocab_size": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
}
_EXPERTS = {"num_experts_per_tok": 1, "moe_intermediate_size": 16}

#: case -> (model_type, config kwargs, each layer's window).
WINDOWED: dict[str, tuple[str, dict[str, Any], list[int | None]]] = {
    "gemma2": ("gemma2", {"sliding_window": 8}, [8, None, 8, None]),
    "gemma3_text": (
        "gemma3_text",
        {"sliding_window": 8, "num_hidden_layers": 6},
        [8, 8, 8, 8, 8, None],
    ),
    "gemma3_pattern2": (
        "gemma3_text",
        {"sliding_window": 8, "sliding_window_pattern": 2},
        [8, None, 8, None],
    ),
    "mistral": ("mistral", {"sliding_window": 8}, [8] * 4),
    "mixtral": (
        "mixtral",
        {"sliding_window": 8, "num_local_experts": 2, "num_experts_per_tok": 1},
        [8] * 4,
    ),
    "phi3": ("phi3", {"sliding_window": 8}, [8] * 4),
    "starcoder2": ("starcoder2", {"sliding_window": 8}, [8] * 4),
    "qwen2": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
        [None, 8, 8, 8],
    ),
    "qwen2_off": ("qwen2", {"sliding_window": 8}, [None] * 4),
    "qwen2_moe": (
        "qwen2_moe",
        {
            **_EXPERTS,
            "num_experts": 2,
            "shared_expert_intermediate_size": 16,
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 3,
        },
        [8, None, 8, None],
    ),
    "qwen3": (
        "qwen3",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
        [None, None, 8, 8],
    ),
    "qwen3_moe": (
        "qwen3_moe",
        {**_EXPERTS, "num_experts": 2, "use_sliding_window": True, "sliding_window": 8},
        [8] * 4,
    ),
    "gpt_oss": (
        "gpt_oss",
        {"sliding_window": 8, "num_local_experts": 2, "num_experts_per_tok": 1},
        [8, None, 8, None],
    ),
}


class _Recorder:
    """An attention backend stand-in that records each layer's window."""

    def __init__(self) -> None:
        self.windows: list[int | None] = []

    def forward(self, q, k, v, key_cache, value_cache, meta, options):
        self.windows.append(options.sliding_window)
        return torch.zeros_like(q)


def _attention_windows(config: Any, group_windows: list[int | None]) -> list[int | None]:
    """The window each layer's attention call passes, one KV cache group per
    layer with ``group_windows``."""
    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
    n = config.num_hidden_layers
    rec = _Recorder()
    caches = [(torch.zeros(1), torch.zeros(1))] * n
    ctx = ForwardContext(caches, [None] * n, rec, list(range(n)), group_windows)
    ids = torch.arange(5)[None]
    with set_forward_context(ctx), torch.no_grad():
        model.get_decoder()(input_ids=ids, position_ids=ids, use_cache=False)
    return rec.windows


@pytest.mark.parametrize("case", list(WINDOWED))
def test_layer_windows_are_what_transformers_applies(case: str) -> None:
    model_type, kwargs, want = WINDOWED[case]
    config = AutoConfig.for_model(model_type, **{**_TINY, **kwargs})
    assert layer_sliding_windows(config) == want
    assert _attention_windows(config, want) == want


def test_a_layer_whose_window_is_not_its_groups_raises() -> None:
    model_type, kwargs, windows = WINDOWED["gemma2"]
    config = AutoConfig.for_model(model_type, **{**_TINY, **kwargs})
    with pytest.raises(RuntimeError, match="layer 0 attends with sliding_window=8.*group 0"):
        _attention_windows(config, [16, None, 16, None])
    with pytest.raises(RuntimeError, match="layer 1 attends with sliding_window=None.*group 1"):
        _attention_windows(config, [8, 8, 8, 8])


def test_full_group_accepts_any_window() -> None:
    """A full-attention group keeps every token: a windowed layer in it (as
    with disable_hybrid_kv_cache_manager) attends with its own window."""
    module = torch.nn.Module()
    module.layer_idx = 0
    rec = _Recorder()
    q, kv = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    with set_forward_context(ForwardContext([(None, None)], [None], rec, [0], [None])):
        paged_attention_forward(module, q, kv, kv, None, sliding_window=8)
    assert rec.windows == [8]


# --------------------------------------------- engine outputs against HF eager

WINDOW, BS, NEW_TOKENS, MAX_LEN = 8, 4, 20, 72
LONG_PROMPTS = [  # 46, 33 and 33 tokens: several windows each
    PROMPTS[3],
    "Once upon a time, in a small village between two rivers, there lived an old clockmaker "
    "who repaired every clock in the valley and told stories to the children.",
    "Summarize the following: the meeting covered the budget for next year, the hiring plan "
    "for the new team, and a long discussion about moving the office downtown.",
]
ALL_PROMPTS = [PROMPTS[0], PROMPTS[4], *LONG_PROMPTS]  # 4 and 13 tokens, then the long ones

_MODEL: dict[str, Any] = {
    "vocab_size": 49152,  # the default model's tokenizer
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "sliding_window": WINDOW,
    "initializer_range": 0.5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}

#: case -> (model_type, config kwargs, KV cache groups' windows).
MODELS: dict[str, tuple[str, dict[str, Any], list[int | None]]] = {
    # 5 sliding layers to 1 full: one layer per group (gs = 1).
    "gemma3": (
        "gemma3_text",
        {"num_hidden_layers": 6, "query_pre_attn_scalar": 16},
        [None] + [WINDOW] * 5,
    ),
    # Alternating: two groups of 2.
    "gemma2": ("gemma2", {"num_hidden_layers": 4, "query_pre_attn_scalar": 16}, [None, WINDOW]),
    # Sliding only: one group of all layers.
    "mistral": ("mistral", {"num_hidden_layers": 2}, [WINDOW]),
}


@dataclass
class HybridModel:
    name: str
    folder: Path
    greedy: list[list[int]]  # HF eager greedy on ALL_PROMPTS

    @property
    def windows(self) -> list[int | None]:
        return MODELS[self.name][2]


@pytest.fixture(scope="module", params=list(MODELS))
def hybrid(request, tmp_path_factory, default_model_dir: Path) -> HybridModel:
    name = request.param
    model_type, kwargs, _ = MODELS[name]
    folder = tmp_path_factory.mktemp(f"hybrid-{name}")
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**_MODEL, **kwargs})
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(folder)
    greedy = hf_greedy(folder, ALL_PROMPTS, NEW_TOKENS, attn_implementation="eager")
    return HybridModel(name, folder, greedy)


def _llm(h: HybridModel, **kwargs: Any) -> LLM:
    kwargs = {"num_gpu_blocks_override": 512, **kwargs}
    return LLM(str(h.folder), block_size=BS, max_model_len=MAX_LEN, **kwargs)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _all_free(llm: LLM) -> bool:
    s = llm.kv_cache_stats()
    return s["num_free_blocks"] == s["num_total_blocks"] and all(
        g["num_used_blocks"] == 0 for g in s["groups"]
    )


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_matches_hf(hybrid: HybridModel, caching: bool) -> None:
    llm = _llm(hybrid, enable_prefix_caching=caching)
    assert llm.llm_engine.engine_core.kv_spec.sliding_windows == hybrid.windows
    groups = llm.kv_cache_stats()["groups"]
    assert [g["sliding_window"] for g in groups] == hybrid.windows
    assert [g["layers"] for g in groups] == [
        list(g.layers) for g in llm.llm_engine.engine_core.kv_spec.groups
    ]
    outs = llm.generate(ALL_PROMPTS, GREEDY)
    assert _tokens(outs) == hybrid.greedy
    assert sum(len(o.prompt_token_ids) > 4 * WINDOW for o in outs) == 3
    if caching:  # again, from the prefix cache
        assert _tokens(llm.generate(ALL_PROMPTS, GREEDY)) == hybrid.greedy
        assert llm.kv_cache_stats()["prefix_cache_hits"] > 0
    assert _all_free(llm)


def test_torch_backend_and_one_full_group_match_hf(hybrid: HybridModel) -> None:
    torch_llm = _llm(hybrid, attention_backend="torch")
    assert _tokens(torch_llm.generate(ALL_PROMPTS, GREEDY)) == hybrid.greedy
    flat = _llm(hybrid, disable_hybrid_kv_cache_manager=True)
    assert [g["sliding_window"] for g in flat.kv_cache_stats()["groups"]] == [None]
    assert _tokens(flat.generate(ALL_PROMPTS, GREEDY)) == hybrid.greedy


#: Device blocks that force preemption of ALL_PROMPTS in chunks of 16 tokens.
TIGHT = {"gemma3": 64, "gemma2": 40, "mistral": 12}


@pytest.mark.parametrize(("mode", "caching"), [("recompute", False), ("swap", True)])
def test_preempted_outputs_match_hf(hybrid: HybridModel, mode: str, caching: bool) -> None:
    llm = _llm(
        hybrid,
        num_gpu_blocks_override=TIGHT[hybrid.name],
        max_num_batched_tokens=16,
        preemption_mode=mode,
        swap_space=0.01,
        enable_prefix_caching=caching,
    )
    assert _tokens(llm.generate(ALL_PROMPTS, GREEDY)) == hybrid.greedy
    stats = llm.kv_cache_stats()
    assert stats["num_preemptions"] > 0
    if mode == "swap":
        assert stats["num_swapped_out"] > 0
        assert stats["num_free_cpu_blocks"] == stats["num_cpu_blocks"]
    assert _all_free(llm)


def test_parallel_sampling_equals_one_full_group(hybrid: HybridModel) -> None:
    """n = 3 forks share the prompt's blocks in every group (copy-on-write in
    the sliding ones); seeded samples equal those of one full group, and
    greedy forks equal HF."""
    prompts = LONG_PROMPTS[:2]
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=NEW_TOKENS)
    llm = _llm(hybrid)
    got = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]
    flat = _llm(hybrid, disable_hybrid_kv_cache_manager=True)
    assert got == [[c.token_ids for c in o.outputs] for o in flat.generate(prompts, params)]
    assert all(len({tuple(c) for c in cs}) > 1 for cs in got)  # the samples differ
    two = llm.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=NEW_TOKENS))
    want = hybrid.greedy[2:4]
    assert [[c.token_ids for c in o.outputs] for o in two] == [[w, w] for w in want]
    assert _all_free(llm)


def test_beam_search_matches_hf(hybrid: HybridModel) -> None:
    llm = _llm(hybrid)
    prompts = LONG_PROMPTS[:2]
    params = BeamSearchParams(beam_width=3, max_tokens=12, length_penalty=1.0)
    outs = llm.beam_search(prompts, params)
    tok = AutoTokenizer.from_pretrained(hybrid.folder)
    model = AutoModelForCausalLM.from_pretrained(
        hybrid.folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    for prompt, out in zip(prompts, outs, strict=True):
        assert [c.token_ids for c in out.outputs] == hf_beams(model, tok, prompt, 3, 12)
    assert _all_free(llm)


@pytest.mark.parametrize("caching", [True, False])
def test_sliding_groups_hold_only_their_window(hybrid: HybridModel, caching: bool) -> None:
    """Per-group stats: a sliding group holds at most about window / bs + 2
    blocks per sequence, a full group one block per bs tokens, all kept."""
    engine = LLMEngine(
        EngineArgs(
            model=str(hybrid.folder),
            block_size=BS,
            max_model_len=MAX_LEN,
            num_gpu_blocks_override=512,
            enable_prefix_caching=caching,
        )
    )
    engine.add_request("a", list(range(600, 640)), SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("b", list(range(700, 730)), SamplingParams(max_tokens=30, ignore_eos=True))
    windows = hybrid.windows
    history = []  # (running, used blocks per group) after each step
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.kv_cache_stats()
        assert [g["sliding_window"] for g in stats["groups"]] == windows
        assert sum(g["num_used_blocks"] for g in stats["groups"]) == stats["num_used_blocks"]
        history.append((stats["num_running"], [g["num_used_blocks"] for g in stats["groups"]]))
    assert len(history) == 30 and all(running == 2 for running, _ in history[:-1])
    for running, used in history:
        for window, n in zip(windows, used, strict=True):
            if window is not None:
                assert n <= (window // BS + 2) * running, history
    if None in windows:  # the full group keeps every token: 40 + 30 + 2 * 28 at the end
        full = [used[windows.index(None)] for _, used in history[:-1]]
        assert full == sorted(full) and full[-1] >= (40 + 30 + 2 * 28) // BS
    assert history[-1][1] == [0] * len(windows)


def test_tensor_parallel_hybrid_qwen2_matches_hf(tmp_path: Path, default_model_dir: Path) -> None:
    """Two ranks share rank 0's KV cache groups (Qwen2: layers 0 and 1 full, 2
    and 3 sliding), each with its half of the KV heads."""
    torch.manual_seed(0)
    kwargs = {k: v for k, v in _MODEL.items() if k != "head_dim"}
    config = AutoConfig.for_model(
        "qwen2",
        **kwargs,
        num_hidden_layers=4,
        use_sliding_window=True,
        max_window_layers=2,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(tmp_path)
    prompts = LONG_PROMPTS[:1]
    want = hf_greedy(tmp_path, prompts, NEW_TOKENS, attn_implementation="eager")
    llm = LLM(
        str(tmp_path), block_size=BS, max_model_len=MAX_LEN, num_gpu_blocks_override=256,
        tensor_parallel_size=2,
    )  # fmt: skip
    try:
        assert llm.llm_engine.engine_core.kv_spec.groups == (
            KVCacheGroupSpec(None, (0, 1)),
            KVCacheGroupSpec(WINDOW, (2, 3)),
        )
        assert (
            llm.llm_engine.engine_core.runner.kv_cache_spec.groups
            == llm.llm_engine.engine_core.kv_spec.groups
        )
        assert llm.llm_engine.engine_core.runner.kv_cache_spec.num_kv_heads == 1
        assert _tokens(llm.generate(prompts, GREEDY)) == want
        assert _all_free(llm)
    finally:
        llm.shutdown()


def test_metrics_have_per_group_gauges() -> None:
    from pagedrs.entrypoints.openai.metrics import EngineStatsCollector
    from prometheus_client import CollectorRegistry, generate_latest

    groups = [
        {"sliding_window": None, "num_used_blocks": 7, "num_token_states": 25,
         "num_allocated_slots": 28, "kv_cache_utilization": 25 / 28},
        {"sliding_window": 512, "num_used_blocks": 3, "num_token_states": 9,
         "num_allocated_slots": 12, "kv_cache_utilization": 0.75},
    ]  # fmt: skip

    class _Engine:
        def kv_cache_stats(self) -> dict[str, Any]:
            return {"num_total_blocks": 64, "num_used_blocks": 10, "groups": groups}

    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(_Engine(), "m"))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    for line in (
        'pagedrs:kv_cache_group_used_blocks{kv_cache_group="0",model_name="m",'
        'sliding_window="none"} 7.0',
        'pagedrs:kv_cache_group_used_blocks{kv_cache_group="1",model_name="m",'
        'sliding_window="512"} 3.0',
        'pagedrs:kv_cache_group_token_states{kv_cache_group="1",model_name="m",'
        'sliding_window="512"} 9.0',
        'pagedrs:kv_cache_group_utilization{kv_cache_group="1",model_name="m",'
        'sliding_window="512"} 0.75',
    ):
        assert line in text, text
