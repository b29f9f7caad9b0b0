"""The capacity planner: a trace replayed through the engine's own Rust
scheduler with a step-time model in place of the forward pass (``pagedrs
plan``; docs/planner.md).

Modules, one concept each: :mod:`~pagedrs.plan.trace` (requests and
arrivals; its sources :mod:`~pagedrs.plan.dataset_trace`,
:mod:`~pagedrs.plan.chat_trace`, :mod:`~pagedrs.plan.jsonl_trace`),
:mod:`~pagedrs.plan.models` (model shapes),
:mod:`~pagedrs.plan.hardware` (device profiles), :mod:`~pagedrs.plan.step_time`
(the roofline step-time model), :mod:`~pagedrs.plan.config` (a simulated
deployment), :mod:`~pagedrs.plan.routers` (data-parallel routing),
:mod:`~pagedrs.plan.simulator` (the loop), :mod:`~pagedrs.plan.metrics`,
:mod:`~pagedrs.plan.sweep` (rates and the latency objective),
:mod:`~pagedrs.plan.report` (tables, JSON, plot),
:mod:`~pagedrs.plan.calibrate` (measuring this CPU for its profile),
:mod:`~pagedrs.plan.calibration_fit` (the profile's fit).
"""

from .config import PlanConfig, expand_configs
from .hardware import HardwareProfile, load_profile
from .jsonl_trace import read_jsonl_trace
from .metrics import latency_summary, summarize
from .models import ModelShape, resolve_model_shape
from .simulator import SimResult, simulate
from .step_time import StepShape, StepTimeModel
from .sweep import SLO, max_rate, run_plan
from .trace import Trace, TraceRequest
from .trace_sources import load_trace

__all__ = [
    "SLO",
    "HardwareProfile",
    "ModelShape",
    "PlanConfig",
    "SimResult",
    "StepShape",
    "StepTimeModel",
    "Trace",
    "TraceRequest",
    "expand_configs",
    "latency_summary",
    "load_profile",
    "load_trace",
    "max_rate",
    "read_jsonl_trace",
    "resolve_model_shape",
    "run_plan",
    "simulate",
    "summarize",
]
