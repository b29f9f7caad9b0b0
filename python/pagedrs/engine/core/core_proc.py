"""The engine-core process: builds the engine, then loops schedule -> execute ->
sample -> update, reading the front end's messages between steps.

Its main thread does nothing else: messages are decoded between steps (a few
microseconds each) and ZeroMQ's own I/O thread moves the bytes. The process
exits on ``Shutdown``, when its parent is gone, or after reporting a fatal
error (``CoreFailed``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import msgspec
import zmq

from .messages import CoreFailed, CoreReady, Shutdown, input_decoder

logger = logging.getLogger(__name__)

# Idle wait between checks that the parent is alive (ms).
_IDLE_POLL_MS = 500


def run_engine_core(
    engine_args: Any,
    input_address: str,
    output_address: str,
    parent_pid: int,
    torch_threads: int,
    log_level: str = "WARNING",
) -> None:
    """Process entry point (``multiprocessing`` spawn target).

    Args:
        engine_args: the ``EngineArgs`` to build the engine from.
        input_address: ZeroMQ address the front end sends on (PULL here).
        output_address: ZeroMQ address the front end receives on (PUSH here).
        parent_pid: the front end's pid; the core exits when it is gone.
        torch_threads: torch's intra-op threads for the model.
        log_level: logging level of this process.
    """
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context(io_threads=1)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(output_address)
    inp = ctx.socket(zmq.PULL)
    inp.connect(input_address)
    encoder = msgspec.msgpack.Encoder()
    try:
        import torch

        torch.set_num_threads(max(1, torch_threads))
        from ..llm_engine import LLMEngine
        from .engine_core import EngineCore

        engine = LLMEngine(engine_args, detokenize=False)
        core = EngineCore(engine)
        out.send(
            encoder.encode(
                CoreReady(
                    engine.max_model_len,
                    int(engine.model.config.vocab_size),
                    engine.kv_cache_stats(),
                )
            )
        )
    except BaseException as exc:
        if isinstance(exc, (ValueError, TypeError)):  # bad arguments: the front end says why
            logger.info("the engine core refused to start: %s", exc)
        else:
            logger.exception("the engine core could not start")
        out.send(encoder.encode(CoreFailed(type(exc).__name__, str(exc))))
        _close(ctx, out, inp)
        return
    try:
        _loop(core, inp, out, encoder, parent_pid)
    except BaseException as exc:
        logger.exception("the engine core loop died")
        out.send(encoder.encode(CoreFailed(type(exc).__name__, f"{type(exc).__name__}: {exc}")))
    finally:
        try:
            engine.shutdown()
        finally:
            _close(ctx, out, inp)


def _loop(
    core: Any, inp: zmq.Socket[bytes], out: zmq.Socket[bytes], encoder: Any, parent_pid: int
) -> None:
    decoder = input_decoder()
    poller = zmq.Poller()
    poller.register(inp, zmq.POLLIN)
    while True:
        if os.getppid() != parent_pid:
            logger.warning("the front end is gone; the engine core exits")
            return
        busy = core.has_work()
        if not poller.poll(0 if busy else _IDLE_POLL_MS) and not busy:
            continue
        received = False
        while True:
            try:
                raw = inp.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            msg = decoder.decode(raw)
            if isinstance(msg, Shutdown):
                return
            core.apply(msg)
            received = True
        if received or core.has_work():
            out.send(encoder.encode(core.step()))


def _close(ctx: zmq.Context[Any], *sockets: zmq.Socket[bytes]) -> None:
    for s in sockets:
        s.close()
    ctx.term()
