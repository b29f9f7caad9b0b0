"""The quantized kernels' own error on a real model: SmolLM2-135M-Instruct
with every decoder projection held as int8 per output channel
(``quantize_int8``), once run as float32 on the dequantized weights
(``F.linear``, the reference) and once through ``QuantizedLinear`` (the Rust
kernels, activations quantized per 32-value block), teacher-forced over
alpaca replies from ``../shared/data``: mean |dlogprob| of each next token
and greedy (argmax) agreement. The weights are the same in both, so the
difference is the kernels' activation rounding and float32 summation order.

    python benches/bench_quant_quality.py [--texts 8] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import json_safe, print_table, read_data
from pagedrs.executor.quant.linear import QuantizedLinear, quant_isas
from pagedrs.executor.quant.weight import quantize_int8
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = Path.home() / ".cache/pagedrs/models/smollm2-135m-instruct"


class _Kernel(torch.nn.Module):
    def __init__(self, lin: QuantizedLinear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def build(kernel: bool) -> torch.nn.Module:
    """The model with int8 projections: float (dequantized) or the kernels."""
    model = AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="eager"
    )
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and name != "lm_head":
                q = quantize_int8(child.weight)
                if kernel:
                    setattr(module, name, _Kernel(QuantizedLinear([q], child.bias)))
                else:
                    child.weight.copy_(q.dequantize())
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    tok = AutoTokenizer.from_pretrained(MODEL)
    data = read_data("alpaca_en_demo.json")[: args.texts]
    ref, ker = build(False), build(True)
    total, count, agree = 0.0, 0, 0
    for d in data:
        ids = tok(d["instruction"] + "\n" + d["output"], return_tensors="pt").input_ids[:, :256]
        a = torch.log_softmax(ref(ids).logits[0, :-1], -1)
        b = torch.log_softmax(ker(ids).logits[0, :-1], -1)
        target = ids[0, 1:, None]
        total += (a.gather(1, target) - b.gather(1, target)).abs().sum().item()
        count += target.numel()
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    fig = {
        "model": "SmolLM2-135M-Instruct, int8 per channel",
        "isa": quant_isas()[0],
        "tokens": count,
        "mean_abs_dlogprob": total / count,
        "greedy_agreement": agree / count,
    }
    print_table(
        "quantized kernels vs float on the same int8 weights",
        ["tokens", "mean |dlogprob|", "greedy agreement"],
        [[count, f"{fig['mean_abs_dlogprob']:.5f}", f"{fig['greedy_agreement']:.4f}"]],
    )
    if args.json:
        print(json.dumps(json_safe(fig)))


if __name__ == "__main__":
    main()
