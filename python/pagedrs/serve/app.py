"""N engine replicas behind one OpenAI-compatible endpoint, on Ray Serve.

Two deployments: ``EngineReplica`` (N replicas of
:class:`~pagedrs.serve.replica.EngineReplica`, routed by a request router,
:class:`~pagedrs.serve.router.PrefixCacheRouter` by default) and
``OpenAIIngress`` (one replica serving the same FastAPI app as ``pagedrs
serve``, ``pagedrs.entrypoints.openai.api_server.build_app``, over a
:class:`~pagedrs.serve.pool_client.ReplicaPoolClient`). Ray Serve's HTTP proxy
forwards to the ingress; the ingress tokenizes, and the router picks a replica.

    pagedrs serve MODEL --ray --data-parallel-size 2 --port 8000

or from Python::

    from ray import serve
    from pagedrs.serve import build_serve_app
    serve.run(build_serve_app(EngineArgs(model=...), data_parallel_size=2))

``ray.init()`` joins the cluster ``RAY_ADDRESS`` names, else starts a local one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

from ..engine.arg_utils import EngineArgs

if TYPE_CHECKING:
    from ..entrypoints.openai.chat_options import ChatOptions

logger = logging.getLogger(__name__)

__all__ = ["ROUTERS", "build_serve_app", "run_ray_server"]

#: Request routers by name: ours and the baselines ``benches/bench_routing.py`` compares.
ROUTERS: dict[str, str] = {
    "pagedrs": "pagedrs.serve.router:PrefixCacheRouter",
    "power_of_two": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    "round_robin": "pagedrs.serve.baseline_routers:RoundRobinRouter",
    "ray_prefix_affinity": (
        "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router"
        ":PrefixCacheAffinityRouter"
    ),
}


class OpenAIIngress:
    """The HTTP ingress: ``build_app`` over a ``ReplicaPoolClient``.

    Args:
        replicas: the ``EngineReplica`` deployment's handle.
        served_model_names: names clients may put in ``model``.
        root_model: the model path or alias.
        api_key: the key ``/v1`` routes require, or None.
        max_request_body_bytes: the largest request body accepted.
        max_waiting_requests: prompts one request may carry.
        chat_options: chat template and tool-call / reasoning parsers.
        lora_modules: with the replicas' ``enable_lora``, the (name, path)
            adapters served by name (``--lora-modules``).
    """

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self,
        replicas: Any,
        served_model_names: list[str],
        root_model: str,
        api_key: str | None,
        max_request_body_bytes: int,
        max_waiting_requests: int,
        chat_options: ChatOptions | None = None,
        lora_modules: list[tuple[str, str]] | None = None,
    ) -> None:
        from ..entrypoints.openai.serving_lora import LoRAModules
        from ..executor.model_loader import load_tokenizer, local_model_path
        from .pool_client import ReplicaPoolClient

        info = await replicas.info.remote()
        args = info.engine_args
        path = local_model_path(args["model"], args.get("revision"), args.get("download_dir"))
        tokenizer = load_tokenizer(
            path, args.get("tokenizer"), args.get("revision"), args.get("download_dir")
        )
        self.client = ReplicaPoolClient(replicas, info, tokenizer, max_waiting_requests)
        self._app_args = (served_model_names, root_model, api_key, max_request_body_bytes)
        self._chat_options = chat_options
        self._lora = (  # LoRA (pagedrs.lora): each replica loads an adapter on first use
            LoRAModules(served_model_names, args["max_lora_rank"], lora_modules or [])
            if args.get("enable_lora")
            else None
        )

    def __serve_build_asgi_app__(self) -> Any:
        from ..entrypoints.openai.api_server import build_app

        names, root, api_key, max_body = self._app_args
        return build_app(
            self.client,
            names,
            api_key=api_key,
            root_model=root,
            shutdown_engine=False,
            max_request_body_bytes=max_body,
            chat_options=self._chat_options,
            lora_modules=self._lora,
        )

    def __del__(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.shutdown()


def build_serve_app(
    engine_args: EngineArgs,
    *,
    data_parallel_size: int = 1,
    router: str = "pagedrs",
    router_kwargs: dict[str, Any] | None = None,
    served_model_names: list[str] | None = None,
    api_key: str | None = None,
    max_request_body_bytes: int | None = None,
    max_waiting_requests: int = 1024,
    torch_threads: int = 1,
    replica_num_cpus: float = 1.0,
    log_level: str = "WARNING",
    routing_stats_period_s: float = 1.0,
    chat_options: ChatOptions | None = None,
    lora_modules: list[tuple[str, str]] | None = None,
) -> Any:
    """The Ray Serve application: ``data_parallel_size`` engine replicas and
    the OpenAI ingress.

    Args:
        engine_args: every replica's engine (its ``kv_events_config``
            endpoints and ``data_parallel_rank`` are set per replica).
        data_parallel_size: engine replicas.
        router: a name of :data:`ROUTERS`.
        router_kwargs: the router's ``initialize_state`` arguments.
        served_model_names: names clients may put in ``model`` (default: the model).
        api_key: if set, the key ``/v1`` routes require.
        max_request_body_bytes: the largest request body accepted (default: the
            server's).
        max_waiting_requests: bound of each replica's waiting queue.
        torch_threads: torch threads of each replica's engine core.
        replica_num_cpus: Ray CPUs each replica reserves.
        log_level: logging level of the engine cores.
        routing_stats_period_s: how often Ray Serve reads each replica's
            routing stats (KV event endpoints).
        chat_options: the ingress's chat template and tool-call / reasoning
            parsers (default: the model's template, no parsers).
        lora_modules: with ``engine_args.enable_lora``, the (name, path)
            adapters served by name (``--lora-modules``): a request names one
            in ``model``, runs it on the replica the router picks (the
            prefix-cache router hashes the adapter's id, so it goes where that
            adapter's blocks are), and the replica loads it on first use. With
            ``PAGEDRS_ALLOW_RUNTIME_LORA_UPDATING`` set here, the ingress
            serves ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.
    Returns:
        a bound ``ray.serve`` application for ``serve.run``.
    Raises:
        ValueError: ``data_parallel_size`` < 1, an unknown router,
            ``lora_modules`` without ``enable_lora``, or an adapter that
            cannot be read (its file named).
    """
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from ..entrypoints.openai.cli_args import DEFAULT_MAX_REQUEST_BODY_BYTES
    from .replica import EngineReplica

    if data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {sorted(ROUTERS)}, got {router!r}")
    ingress_options: dict[str, Any] = {"num_cpus": 0}
    if engine_args.enable_lora:  # LoRA (pagedrs.lora): adapters read here first
        from ..entrypoints.openai.serving_lora import (
            ALLOW_RUNTIME_LORA_UPDATING,
            LoRAModules,
            runtime_updating_allowed,
        )

        names = served_model_names or [engine_args.model]
        LoRAModules(names, engine_args.max_lora_rank, lora_modules or [])
        if runtime_updating_allowed():
            ingress_options["runtime_env"] = {"env_vars": {ALLOW_RUNTIME_LORA_UPDATING: "1"}}
    elif lora_modules:
        raise ValueError("lora_modules needs enable_lora")
    if not engine_args.enable_prefix_caching and router == "pagedrs":
        logger.warning("the pagedrs router routes by the prefix cache: enable_prefix_caching")
    deployment: Any = serve.deployment  # its overloads confuse type checkers
    router_config: Any = RequestRouterConfig  # a pydantic model
    replicas = deployment(
        EngineReplica,
        name="EngineReplica",
        num_replicas=data_parallel_size,
        ray_actor_options={"num_cpus": replica_num_cpus},
        max_ongoing_requests=engine_args.max_num_seqs + max_waiting_requests,
        health_check_period_s=2.0,
        request_router_config=router_config(
            request_router_class=ROUTERS[router],
            request_router_kwargs=router_kwargs or {},
            request_routing_stats_period_s=routing_stats_period_s,
        ),
    ).bind(dataclasses.asdict(engine_args), max_waiting_requests, torch_threads, log_level)
    ingress = deployment(
        serve.ingress()(OpenAIIngress),
        name="OpenAIIngress",
        num_replicas=1,
        ray_actor_options=ingress_options,
        max_ongoing_requests=100_000,
    )
    return ingress.bind(
        replicas,
        served_model_names or [engine_args.model],
        engine_args.model,
        api_key,
        max_request_body_bytes or DEFAULT_MAX_REQUEST_BODY_BYTES,
        max_waiting_requests,
        chat_options,
        lora_modules,
    )


def run_ray_server(ns: argparse.Namespace) -> int:
    """``pagedrs serve --ray``: start (or join) Ray, deploy the application
    and serve until interrupted.

    Raises:
        ValueError: invalid arguments.
    """
    import ray
    from ray import serve

    from ..entrypoints.openai.cli_args import chat_options_of, engine_args
    from ..entrypoints.openai.serving_lora import parse_lora_modules

    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    args = engine_args(ns)
    n = ns.data_parallel_size
    threads = ns.torch_threads or max(1, (os.cpu_count() or 1) // n)
    app = build_serve_app(
        args,
        data_parallel_size=n,
        router=ns.request_router,
        served_model_names=ns.served_model_name,
        api_key=ns.api_key,
        max_request_body_bytes=ns.max_request_body_bytes,
        max_waiting_requests=ns.max_waiting_requests,
        torch_threads=threads,
        replica_num_cpus=min(1.0, (os.cpu_count() or 1) / n),
        log_level=ns.log_level.upper(),
        chat_options=chat_options_of(ns),
        lora_modules=parse_lora_modules(ns.lora_modules or []),
    )
    ray.init(ignore_reinit_error=True)
    serve.start(http_options={"host": ns.host, "port": ns.port})
    logger.info("serving %s on %d replicas at http://%s:%d", ns.model, n, ns.host, ns.port)
    try:
        serve.run(app, name="pagedrs", route_prefix="/", blocking=True)
    except KeyboardInterrupt:  # SIGINT: the way to stop it
        logger.info("interrupted: stopping the replicas")
    finally:
        serve.shutdown()
    return 0
