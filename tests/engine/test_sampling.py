"""Sampling: seeds reproduce, top-k 1 is greedy, top-p keeps the nucleus; chat and CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pagedrs import LLM, SamplingParams
from pagedrs.executor.sampler import Sampler, argmax_rows


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), max_model_len=128, seed=1)


def _ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_seed_reproduces_whatever_the_batch(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = _ids(llm.generate(["Once upon a time"], p))
    other = SamplingParams(temperature=1.0, max_tokens=12)
    mixed = _ids(llm.generate(["Once upon a time", "Hi", "Why?"], [p, other, other]))
    assert alone[0] == mixed[0]
    differ = _ids(
        llm.generate(["Once upon a time"], SamplingParams(temperature=1.0, seed=99, max_tokens=12))
    )
    assert differ[0] != alone[0]


def test_top_k_one_equals_greedy(llm: LLM) -> None:
    greedy = _ids(llm.generate(["The sky is"], SamplingParams(temperature=0.0, max_tokens=10)))
    top1 = _ids(
        llm.generate(["The sky is"], SamplingParams(temperature=0.8, top_k=1, max_tokens=10))
    )
    assert greedy == top1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_equals_torch_argmax(dtype: torch.dtype) -> None:
    """The greedy argmax equals ``torch.argmax``: ties give the first index,
    a NaN row its first NaN, -inf rows index 0; strided views too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (40, 513), generator=g).to(dtype)  # many ties
    x[3, 7] = x[3, 100] = float("nan")
    x[4] = float("-inf")
    x[5, 9] = float("inf")
    x[6] = -0.0
    x[6, 20] = 0.0
    for view in (x, x[::3], x[:, 1:]):
        assert torch.equal(argmax_rows(view), view.float().argmax(dim=-1))
    big = torch.randn(8, 262144, generator=g).to(dtype)
    assert torch.equal(argmax_rows(big), big.float().argmax(dim=-1))


def test_sampler_filters_against_plain_torch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    temperature = torch.tensor([0.7, 1.0, 1.3])
    top_p = torch.tensor([0.5, 1.0, 0.9])
    top_k = torch.tensor([-1, 5, 0], dtype=torch.int32)
    probs = Sampler._probs(logits, temperature, top_p, top_k)
    for i in range(3):
        ref = torch.softmax(logits[i] / temperature[i], -1)
        order = ref.argsort(descending=True)
        keep = torch.zeros(50, dtype=torch.bool)
        k = int(top_k[i]) if top_k[i] > 0 else 50
        cum = 0.0
        for rank, t in enumerate(order.tolist()):
            if rank >= k or cum >= float(top_p[i]):
                break
            keep[t] = True
            cum += float(ref[t])
        expect = torch.where(keep, ref, 0.0)
        expect = expect / expect.sum()
        torch.testing.assert_close(probs[i], expect, atol=1e-6, rtol=1e-5)


def test_sampling_frequencies_follow_probs() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(4000, 1)
    # The sampler reads only the sampling fields of the step batch.
    batch = SimpleNamespace(
        temperature=np.ones(4000, np.float32),
        top_p=np.ones(4000, np.float32),
        top_k=np.full(4000, -1, np.int32),
        seed=np.full(4000, -1, np.int64),
        num_output_tokens=np.zeros(4000, np.int64),
        num_samples=np.ones(4000, np.int32),
    )
    out = Sampler(0)(logits, batch).token_ids  # type: ignore[arg-type]
    freq = np.bincount(out, minlength=3) / 4000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.03)


def test_stop_token_ids_and_min_tokens(llm: LLM) -> None:
    base = _ids(llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8)))[0]
    stop = base[3]
    first = base.index(stop)
    out = llm.generate(
        ["Hello"], SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop])
    )[0].outputs[0]
    assert out.token_ids == base[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_chat_applies_template(default_model_dir: Path) -> None:
    llm = LLM(str(default_model_dir), max_model_len=512)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(msgs, SamplingParams(temperature=0.0, max_tokens=20))[0]
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out.prompt == text
    assert out.prompt_token_ids == tok(text, add_special_tokens=False).input_ids
    assert "Paris" in out.outputs[0].text


def test_cli_generate() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagedrs.cli",
            "generate",
            "--max-tokens",
            "8",
            "Name three rivers.",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "finish_reason=" in proc.stdout


def test_cli_bad_model_is_a_clear_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pagedrs.cli", "generate", "--model", "nope", "hi"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "unknown model" in proc.stderr


@pytest.mark.parametrize(("argv", "rc"), [(["download"], 0), (["download", "nope"], 2)])
def test_cli_run_exits_with_main_code_after_atexit(argv: list[str], rc: int) -> None:
    """``cli.run`` (the console command) ends the process with ``main()``'s
    code, after the atexit handlers and with everything written."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('atexit handler ran'))\n"
        "from pagedrs.cli import run\n"
        f"sys.argv = ['pagedrs', *{argv!r}]\n"
        "run()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == rc, proc.stderr
    assert proc.stdout.rstrip().endswith("atexit handler ran")
    if rc:
        assert "unknown model 'nope'" in proc.stderr
    else:  # the packaged model's file, then the handler's line
        assert proc.stdout.splitlines()[0].endswith(".gguf")


def test_cli_bad_sampling_flag_fails_before_the_model_loads() -> None:
    """A sampling flag out of range is refused before any model is read: the
    model named does not exist, and the error is the flag's."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagedrs.cli",
            "generate",
            "--model",
            "nope",
            "--max-tokens",
            "-1",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "max_tokens must be an integer >= 1, got -1" in proc.stderr
    assert "unknown model" not in proc.stderr


def test_cli_output_into_a_closed_pipe_exits_quietly() -> None:
    """``pagedrs download | head -0``-style: the reader is gone before the
    output is written; the command exits with 141 and no traceback."""
    import os

    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [sys.executable, "-m", "pagedrs.cli", "download"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr
