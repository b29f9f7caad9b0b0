"""Quantized weights kept in their blocks: GGUF block formats and int8 per output
channel, their tensors (``weight.py``) and the projection that runs on them."""

from .weight import QUANT_TYPES, QuantizedWeight, quantize_int8

__all__ = ["QUANT_TYPES", "QuantizedWeight", "quantize_int8"]
