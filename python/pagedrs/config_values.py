"""The value sets of engine settings that modules of the model stack define
and configuration checks (``EngineArgs``, the command line): kept here, in a
module that imports nothing, so that configuration loads without torch."""

from __future__ import annotations

#: The ``kv_cache_dtype`` settings: "auto" is the model's dtype; "fp8" is
#: "fp8_e4m3" and "int8_per_token_head" is "int8" (vLLM's names).
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "float32",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8",
    "int8_per_token_head",
)

#: The ``load_format`` settings: weights from the checkpoint, or random ones
#: made on the device from the config.
LOAD_FORMATS: tuple[str, ...] = ("auto", "dummy")

#: The ``activation_quantization`` settings: how quantized projections
#: quantize their activations per block of 32 (``executor.quant.linear``);
#: "auto" resolves per model (``model_loader.AUTO_ACTIVATIONS``).
ACTIVATION_QUANTIZATION_CHOICES: tuple[str, ...] = ("auto", "int16", "int8")
