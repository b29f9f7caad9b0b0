"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import numpy as np
import torch

_SEED_MIX = 0x9E3779B97F4A7C15


def _step_seed(seed: int, num_output_tokens: int) -> int:
    """A seed for one request's n-th sampled token, independent of batch mix."""
    return (seed * 1_000_003 + num_output_tokens * _SEED_MIX) % (2**63)


class Sampler:
    """Samples one token per row from logits with each row's own settings.

    Args:
        seed: seeds the generator used by rows without a per-request seed.
    """

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, step: dict[str, np.ndarray]) -> np.ndarray:
        """Sample token ids.

        Args:
            logits: float32 ``[R, V]``.
            step: the step arrays; reads ``temperature``, ``top_p``, ``top_k``
                (float32/float32/int32 ``[R]``), ``seed`` and ``num_output_tokens``
                (int64 ``[R]``).
        Returns:
            int64 ``[R]`` token ids.
        """
        temperature = step["temperature"]
        greedy = temperature == 0.0
        if greedy.all():
            return logits.argmax(dim=-1).cpu().numpy()
        out = logits.argmax(dim=-1).cpu().numpy()
        rows = np.nonzero(~greedy)[0]
        probs = self._probs(
            logits[torch.from_numpy(rows)].cpu(),
            torch.from_numpy(temperature[rows]),
            torch.from_numpy(step["top_p"][rows]),
            torch.from_numpy(step["top_k"][rows]),
        )
        seeds = step["seed"][rows]
        n_out = step["num_output_tokens"][rows]
        noise = torch.empty_like(probs)
        for i in range(len(rows)):
            gen = self.generator
            if seeds[i] >= 0:
                gen = torch.Generator().manual_seed(_step_seed(int(seeds[i]), int(n_out[i])))
            noise[i].exponential_(generator=gen)
        # Exponential race: argmax p_i / E_i draws i with probability p_i.
        out[rows] = (probs / noise).argmax(dim=-1).numpy()
        return out

    @staticmethod
    def _probs(
        logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor
    ) -> torch.Tensor:
        """Softmax of ``logits / temperature`` after top-k and top-p filtering."""
        logits = logits / temperature[:, None]
        vocab = logits.shape[-1]
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).long()
        if bool((k < vocab).any()) or bool((top_p < 1.0).any()):
            sorted_logits, idx = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab)[None, :]
            drop = ranks >= k[:, None]
            p = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            # Drop tokens once the mass before them already reaches top_p.
            mass_before = p.cumsum(dim=-1) - p
            drop |= mass_before >= top_p[:, None]
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
        return logits.softmax(dim=-1)
