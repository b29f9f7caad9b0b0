"""Re-simulating a saved ``bench_planner.py --mode serving`` run
(``--resimulate FILE``): the measured side is the file's (each request's send
time, TTFT, end, prompt and output tokens, and each rate's probe); the
simulated side is computed again, with the profile given and from the
server's prefix cache as it stood at each rate: the prompts the server
computed before it (warm-up, probes, earlier rates and traces of the same
server) are computed first, as ``mode_serving`` does.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from common import chat_prompt_ids
from common import load_trace as serving_trace
from pagedrs.plan import PlanConfig, simulate
from pagedrs.plan import summarize as sim_summary
from pagedrs.plan.trace import Trace, TraceRequest
from planner_engine import PROBE, _bounds, _profile, scaled, settings


def resimulate_serving(ns: argparse.Namespace) -> dict[str, Any]:
    """The serving result of ``ns.resimulate`` with its simulation redone
    under ``ns.profile``.

    Raises:
        SystemExit: the file holds no serving run, or a request whose prompt
            no longer has the token count the server reported.
    """
    from pagedrs.executor.model_loader import hf_folder
    from transformers import AutoTokenizer

    with open(ns.resimulate) as f:
        saved = json.load(f)
    if "serving" not in saved:
        raise SystemExit(f"{ns.resimulate}: no serving run to re-simulate")
    out: dict[str, Any] = saved["serving"]
    cfg = PlanConfig(
        dtype="float32", num_gpu_blocks=ns.num_blocks, max_model_len=2048, **settings(ns)
    )
    profile, sm = _profile(ns, cfg)
    out |= {"profile": str(ns.profile), "source": profile.source, "resimulated_from": ns.resimulate}
    tok = AutoTokenizer.from_pretrained(hf_folder("smollm2-135m-instruct"))
    probe_ids = np.asarray(chat_prompt_ids(tok, PROBE), dtype=np.int64)
    history: list[np.ndarray] = []  # one server served every trace of the file, in order
    for name, t in out["traces"].items():
        n = t["stats"]["num_requests"]
        reqs = serving_trace(name, tok, ns.max_output_tokens, ns.max_prompt_len)
        history.extend(np.asarray(chat_prompt_ids(tok, q.messages)) for q in reqs[-4:])
        whole: list[TraceRequest] = []
        for k, row in enumerate(t["rows"]):
            history.append(probe_ids)
            treqs = []
            for q, (sent, _, _, plen, olen) in zip(
                reqs[k * n : (k + 1) * n], row["requests"], strict=True
            ):
                ids = np.asarray(chat_prompt_ids(tok, q.messages), dtype=np.int64)
                if len(ids) != plen:
                    raise SystemExit(f"{name}: {len(ids)} prompt tokens, the server had {plen}")
                treqs.append(TraceRequest(ids, olen, sent))
            seen = list(history)
            history.extend(r.prompt for r in treqs)
            whole.extend(treqs)
            timed, rate = Trace(f"{name}@{row['request_rate']:g}", treqs, True), row["request_rate"]
            row["simulated"] = sim_summary(simulate(timed, cfg, sm, warm_prompts=seen), rate)
            fast = scaled(sm, row["probe_rel"])
            row["scaled"] = sim_summary(simulate(timed, cfg, fast, warm_prompts=seen), rate)
            row["warm_prompts"] = len(seen)
        t["_trace"] = Trace(name, whole[:n], False)
    _bounds(out, cfg, sm, ns)
    return out
