import contextlib
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from launcher.vllm_serve import VllmServer
from tests.e2e.stack import Stack

# Generous limits: these tests are about the path of a message, not about refusals.
SPINE_SETTINGS = {
    # Every test client comes from 127.0.0.1, and one client follows twenty answers at once in
    # the fault tests: the caps on open streams would be the suite's, not the product's
    # (tests/chat/test_consumers.py tests the caps themselves).
    "STREAMS_MAX_PER_ADDRESS": "100000",
    "STREAMS_MAX_PER_CLIENT": "100000",
    "INFERENCE_ENGINE": "simulated",
    "INFERENCE_MAX_NUM_SEQS": "8",
    "VIP_RESERVED_SLOTS": "2",
    "SIMULATED_OUTPUT_TOKENS": "30",
    "SIMULATED_DECODE_BASE_S": "0.01",
    "RATE_LIMIT_NORMAL_CAPACITY": "100",
    "RATE_LIMIT_VIP_CAPACITY": "100",
    "MAX_CONCURRENT_NORMAL": "50",
    "MAX_CONCURRENT_VIP": "50",
    "JOB_LEASE_S": "3",
    "WORKER_HEARTBEAT_S": "0.5",
    "WORKER_HEARTBEAT_TTL_S": "3",
    # These tests follow a message through the engine; test_answer_cache.py turns the cache on.
    "ANSWER_CACHE_ENABLED": "false",
}


# The variant the migrations make and the stacks route every request to: both servers answer to it.
STABLE_VARIANT = "stable"


def running_stack(**settings_env: str):
    stack = Stack(Path(tempfile.mkdtemp(prefix="e2e-")), **{**SPINE_SETTINGS, **settings_env})
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def stack():
    yield from running_stack()


# The product on real vLLM, and vLLM's own server on the same engine: one of each per session,
# shared by the modules that compare the two and the verified answers' (each engine takes 30-60 s
# to start on CPU).
VLLM_MAX_NUM_SEQS = 8
VLLM_STACK_SETTINGS = {
    "INFERENCE_ENGINE": "vllm",
    "INFERENCE_MAX_NUM_SEQS": str(VLLM_MAX_NUM_SEQS),
    "VIP_RESERVED_SLOTS": "0",
    "GENERATION_TEMPERATURE": "0",
}


# A question the shipped model answers at length under the chat's prompt, whatever the help
# center holds (about 400 tokens at temperature 0): the tests that cancel, kill or break an
# answer part-way ask it, with room for 256 tokens, so that it is still being written when they
# act, however far the streams they read lag behind the engine on a loaded machine.
LONG_ANSWER_QUESTION = "Write a very long story about a lost parcel, at least 500 words."
LONG_ANSWER_MAX_TOKENS = "256"


# The tool-call parser `vllm serve` runs for this model; the stack's stable variant names it too.
VLLM_TOOL_CALL_PARSER = "pythonic"


@pytest.fixture(scope="session")
def vllm_stack():
    with contextlib.closing(running_stack(**VLLM_STACK_SETTINGS)) as stacks:  # closing stops it
        stack = next(stacks)
        named = stack.manage(
            "shell",
            "-c",
            "from scheduler.models import Variant; "
            f"Variant.objects.filter(name={STABLE_VARIANT!r}).update(tool_call_parser={VLLM_TOOL_CALL_PARSER!r})",
        )
        if named.returncode != 0:
            raise RuntimeError(f"naming the stable variant's tool-call parser failed: {named.stderr}")
        yield stack


@pytest.fixture(scope="session")
def vllm_serve():
    """`vllm serve` with the worker's engine arguments (model folder, context, sequences, KV
    cache, chat template), serving the model under the name of the stack's variant. It is
    started, not yet ready: call `wait_ready()` once the product stack is up, so that the two
    engines load at the same time."""
    from inference.engines.vllm import engine_args, server_flags  # imports vLLM and torch

    args = engine_args(
        model_path=settings.INFERENCE_MODEL,
        max_num_seqs=VLLM_MAX_NUM_SEQS,
        max_model_len=settings.INFERENCE_MAX_MODEL_LEN,
        gpu_memory_utilization=settings.INFERENCE_GPU_MEMORY_UTILIZATION,
    )
    server = VllmServer(
        Path(tempfile.mkdtemp(prefix="vllm-serve-")),
        engine_flags=server_flags(args),
        served_model_name=STABLE_VARIANT,
        kv_cache_gib=settings.INFERENCE_KV_CACHE_GIB,
        # The stable variant's tool-call parser: `pythonic` reads calls the model writes as a
        # Python list ("auto"), forces named and "required" choices as the product does (the
        # JSON schema of vLLM's tool-call structured output, no structural tag) and needs no
        # special tokens.
        server_flags=("--enable-auto-tool-choice", "--tool-call-parser", VLLM_TOOL_CALL_PARSER),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
