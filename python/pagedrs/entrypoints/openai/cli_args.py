"""Arguments of ``pagedrs serve`` (kept apart from the server so that the
command line parses without importing FastAPI).

Every :class:`~pagedrs.engine.arg_utils.EngineArgs` field is a flag, generated
by :meth:`EngineArgs.add_cli_args` (``model`` is the optional positional
``MODEL``); the flags here are the server's own.
"""

from __future__ import annotations

import argparse

from ...engine.arg_utils import EngineArgs
from .chat_options import ChatOptions, load_chat_template
from .reasoning import REASONING_PARSERS
from .tool_parsers import TOOL_PARSERS

# 16 MiB. A prompt filling a 131072-token context takes about 0.5 MB as English text
# (about 4 characters a token), and at most about 1.5 MB as JSON-escaped non-Latin
# text ("\uXXXX", 6 bytes a character) or as token ids (up to 8 bytes an id with
# its separator): this leaves a tenfold margin for lists of prompts and long chats.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``pagedrs serve``: the engine's, then the server's.

    Returns:
        ``parser``.
    """
    EngineArgs.add_cli_args(parser, positional_model=True)
    server = parser.add_argument_group("server arguments")
    server.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback)"
    )
    server.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    server.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    server.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="names clients may put in 'model' (default: MODEL)",
    )
    server.add_argument(
        "--max-waiting-requests",
        type=int,
        default=1024,
        help="bound of the queue, 503 beyond (default: %(default)s)",
    )
    server.add_argument(
        "--max-request-body-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="largest request body accepted, in bytes; a larger one gets 413, refused from "
        "its Content-Length before it is read, or once that many bytes have arrived "
        "(default: %(default)s = 16 MiB: a prompt filling a 131072-token context is about "
        "0.5 MB of English text and at most about 1.5 MB of JSON-escaped non-Latin text or "
        "token ids, so this leaves a tenfold margin)",
    )
    server.add_argument(
        "--engine-core-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine core (schedule, model, sampling) in its own process, the "
        "front end (HTTP, tokenization, detokenization) in this one, exchanging msgpack over "
        "ZeroMQ; --no-engine-core-process runs the engine in a thread of this process "
        "(default: %(default)s)",
    )
    server.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the model (default: every core with the engine core "
        "process, whose thread does nothing else; one fewer than the cores without it, so "
        "that the HTTP event loop keeps a core)",
    )
    server.add_argument(  # LoRA (pagedrs.lora)
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders or llama.cpp GGUF LoRA files) served under their "
        "names, which requests put in 'model'; needs --enable-lora. With "
        "PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING=1 in the environment, POST "
        "/v1/load_lora_adapter and /v1/unload_lora_adapter change them",
    )
    server.add_argument(
        "--ray",
        action="store_true",
        help="serve --data-parallel-size engine replicas on Ray Serve behind one endpoint "
        "(pagedrs.serve; needs ray[serve]: pip install 'pagedrs[ray]')",
    )
    server.add_argument(
        "--data-parallel-size",
        type=_positive_int,
        default=1,
        help="engine replicas, with --ray (default: %(default)s)",
    )
    server.add_argument(
        "--request-router",
        default="pagedrs",
        choices=("pagedrs", "power_of_two", "round_robin", "ray_prefix_affinity"),
        help="how --ray picks a replica: pagedrs (the longest prefix cached, by the "
        "replicas' KV events, balanced against load), power_of_two, round_robin or "
        "ray_prefix_affinity (Ray's PrefixCacheAffinityRouter) (default: %(default)s)",
    )
    chat = parser.add_argument_group("chat arguments")
    chat.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template (a file, or the template itself) used instead of the "
        "model's, e.g. one that renders 'tools' (default: the model's)",
    )
    chat.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="serve tool_choice='auto': the model decides to call tools, --tool-call-parser "
        "reads the calls out of its reply",
    )
    chat.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="the format of the model's tool calls",
    )
    chat.add_argument(
        "--structured-tool-calls",
        action="store_true",
        help="hold tool calls to the --tool-call-parser's format and the tools' schemas "
        "(xgrammar structural tag; hermes): with tool_choice='auto' what follows a "
        "<tool_call> tag, with 'required' or a named function the whole reply, written "
        "as the chat template renders calls back (default: off; 'required' is then a JSON "
        "array of calls)",
    )
    chat.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="return the reply's <think> block as reasoning_content",
    )
    server.add_argument(
        "--log-level",
        default="info",
        help="log level of pagedrs and uvicorn: debug, info, warning, error or critical "
        "(default: %(default)s)",
    )
    return parser


def chat_options_of(ns: argparse.Namespace) -> ChatOptions:
    """The chat settings of ``pagedrs serve``'s arguments.

    Raises:
        ValueError: ``--enable-auto-tool-choice`` without ``--tool-call-parser``, or a
            ``--chat-template`` that is neither a file nor a template.
    """
    template = getattr(ns, "chat_template", None)
    return ChatOptions(
        chat_template=None if template is None else load_chat_template(template),
        enable_auto_tool_choice=getattr(ns, "enable_auto_tool_choice", False),
        tool_call_parser=getattr(ns, "tool_call_parser", None),
        structured_tool_calls=getattr(ns, "structured_tool_calls", False),
        reasoning_parser=getattr(ns, "reasoning_parser", None),
    )


def engine_args(ns: argparse.Namespace) -> EngineArgs:
    """Engine arguments from ``pagedrs serve``'s arguments.

    Raises:
        ValueError: invalid values.
    """
    return EngineArgs.from_cli_args(ns)
