"""``shared_gguf_metadata``: inside it transformers parses a GGUF file's
metadata once for the config and the tokenizer, with the same results as
without it, and everything is restored when the scope ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from pagedrs.executor.gguf_metadata import shared_gguf_metadata
from transformers import AutoConfig, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as mgpu

TEXTS = ["Hello world! <|im_start|>user\nhi", "  déjà vu 123\n\n\tx"]


def _load(path: Path) -> tuple[Any, Any]:
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return config, tok


def test_one_parse_same_config_and_tokenizer(
    monkeypatch: pytest.MonkeyPatch, smol_gguf: Path
) -> None:
    ref_config, ref_tok = _load(smol_gguf)
    calls: list[Any] = []
    original = mgpu.load_gguf_checkpoint

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(mgpu, "load_gguf_checkpoint", counting)
    with shared_gguf_metadata():
        with shared_gguf_metadata():  # nested scopes share the parse
            config, tok = _load(smol_gguf)
        config2 = AutoConfig.from_pretrained(smol_gguf.parent, gguf_file=smol_gguf.name)
    assert len(calls) == 1
    assert mgpu.load_gguf_checkpoint is counting
    assert gguf.GGUFReader.__name__ == "GGUFReader"
    assert config.to_dict() == ref_config.to_dict() == config2.to_dict()
    assert config is not config2
    assert type(tok) is type(ref_tok)
    assert len(tok) == len(ref_tok)
    assert tok.chat_template == ref_tok.chat_template
    assert tok.all_special_tokens == ref_tok.all_special_tokens
    for text in TEXTS:
        assert tok(text).input_ids == ref_tok(text).input_ids


def test_array_view_reader_same_fields_and_tensors(smol_gguf: Path) -> None:
    ref = gguf.GGUFReader(smol_gguf)
    with shared_gguf_metadata():
        reader = gguf.GGUFReader(smol_gguf)
    assert type(reader).__name__ == "ArrayViewReader"
    assert type(reader.data) is np.ndarray
    assert list(reader.fields) == list(ref.fields)
    for key, field in ref.fields.items():
        mine = reader.fields[key]
        assert mine.types == field.types and mine.data == field.data, key
        assert len(mine.parts) == len(field.parts), key
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts, strict=True))
    for mine, t in zip(reader.tensors, ref.tensors, strict=True):
        assert mine.name == t.name and np.array_equal(mine.data, t.data)


_LAZY = """
import sys
from pagedrs.executor.gguf_metadata import shared_gguf_metadata
names = ("gguf", "transformers.modeling_gguf_pytorch_utils")
assert not any(n in sys.modules for n in names), "imported before the scope"
with shared_gguf_metadata():
    pass
assert not any(n in sys.modules for n in names), "the scope imported them"
with shared_gguf_metadata():
    import gguf
    from transformers import modeling_gguf_pytorch_utils as mgpu
    assert gguf.GGUFReader.__name__ == "ArrayViewReader"
    assert mgpu.load_gguf_checkpoint.__module__ == "pagedrs.executor.gguf_metadata"
    reader = gguf.GGUFReader(sys.argv[1])
    assert type(reader.data).__name__ == "ndarray"
assert gguf.GGUFReader.__name__ == "GGUFReader"
assert mgpu.load_gguf_checkpoint.__module__ == "transformers.modeling_gguf_pytorch_utils"
with shared_gguf_metadata():
    assert gguf.GGUFReader.__name__ == "ArrayViewReader"
print("ok")
"""


def test_scope_imports_nothing_and_patches_what_it_imports(smol_gguf: Path) -> None:
    """A scope opened before gguf-py and transformers' GGUF utilities are
    imported imports neither; one imported inside it is changed as its import
    completes, and restored when the scope ends."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _LAZY, str(smol_gguf)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
