"""What greedy identity under speculation stands on: the GGUF default model's
logits are the same bits for a request alone, in a batch, and for tokens
computed in a prefill chunk (a verify step's K+1 positions) or decoded one
at a time (the quantized Rust projections sum integers; the attention kernel
runs one reduction order per query token)."""

from __future__ import annotations

from pagedrs import LLM, SamplingParams
from spec_engines import PROMPTS


def _chosen(outs: list, i: int) -> list[float]:
    c = outs[i].outputs[0]
    return [pos[t].logprob for pos, t in zip(c.logprobs, c.token_ids, strict=True)]


def test_logprobs_alone_in_a_batch_and_in_a_chunk(off: LLM) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=0)
    batch = off.generate(PROMPTS[:6], params, use_tqdm=False)
    tok = off.get_tokenizer()
    for i in (0, 3):
        alone = off.generate([PROMPTS[i]], params, use_tqdm=False)
        assert alone[0].outputs[0].token_ids == batch[i].outputs[0].token_ids
        assert _chosen(alone, 0) == _chosen(batch, i)  # bit for bit
        # The prompt and output as one prompt: its last positions' logprobs
        # come from one prefill chunk.
        ids = tok(PROMPTS[i]).input_ids
        out = list(batch[i].outputs[0].token_ids)
        chunk = off.generate(
            [{"prompt_token_ids": ids + out}],
            SamplingParams(max_tokens=1, prompt_logprobs=0),
            use_tqdm=False,
        )[0]
        assert chunk.prompt_logprobs is not None
        got = [
            pos[t].logprob for pos, t in zip(chunk.prompt_logprobs[len(ids) :], out, strict=True)
        ]
        assert got == _chosen(batch, i)
