"""`python -m bench peer`: vLLM's own benchmark client (`vllm bench serve`, run in this process)
against the product's /v1 and against `vllm serve` on the same engine, taking turns.

Both servers run the worker's engine arguments (`inference.engines.vllm.engine_args`). Each
round runs every dataset and concurrency on both, the order of the two swapped every round, so
a neighbour's burst on a shared machine lands on either side. Greedy sampling on both: the same
prompts give the same answers, so both do the same work (the random dataset aside, see below).

Time to first token is read two ways. vLLM's client counts it at the first chunk with a
choice, which both servers send (the assistant's role) with the first token, the text right
after it; the time to the first chunk with text is also computed, for both, from the client's
own per-request timings (`ttft_to_text`), the figure the recorded runs compare (they predate
the product sending its role chunk with the first token rather than on admission).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stack import QUESTIONS, UNLIMITED, running
from bench.stats import percentile
from launcher.vllm_serve import VllmServer

TARGETS = ("product", "vllm_serve")
DATASETS = ("random", "chat")
# The variant the migrations make and the bench stack routes to: both servers answer to it.
STABLE_VARIANT = "stable"
# Customer-service conversations, ShareGPT-shaped (vLLM's client reads that format), made here.
_TOPICS = [
    "my order", "a refund", "my password", "the delivery address", "my subscription",
    "an invoice", "a damaged parcel", "the opening hours", "a gift card", "my account",
]  # fmt: skip
_ASKS = [
    "Can you help me with {}?",
    "I have a problem with {}. What should I do?",
    "How long does it take to sort out {}? I have been waiting for a week and nobody answered.",
    "Explain step by step what I need to do about {}.",
]


def chat_dataset(path: Path) -> Path:
    conversations = [
        {
            "id": f"support-{n}",
            "conversations": [
                {"from": "human", "value": ask.format(topic)},
                {"from": "gpt", "value": f"Here is what to do about {topic}: " + " ".join(QUESTIONS)},
            ],
        }
        for n, (topic, ask) in enumerate((t, a) for a in _ASKS for t in _TOPICS)
    ]
    path.write_text(json.dumps(conversations))
    return path


def _client_args(
    *,
    base_url: str,
    model_path: str,
    served_model_name: str,
    dataset: str,
    chat_path: Path,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    headers: list[str],
) -> Any:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    if dataset == "random":
        dataset_flags = ["--dataset-name", "random", "--random-input-len", str(input_len)]
        dataset_flags += ["--random-output-len", str(output_len)]
    else:
        dataset_flags = ["--dataset-name", "sharegpt", "--dataset-path", str(chat_path)]
        dataset_flags += ["--sharegpt-output-len", str(output_len)]
    flags = [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", base_url,
        "--model", model_path, "--served-model-name", served_model_name, "--tokenizer", model_path,
        *dataset_flags,
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--temperature", "0", "--num-warmups", "1", "--disable-tqdm", "--seed", "0",
        "--save-detailed",  # keeps the per-request timings in the result (no file without --save-result)
        *(["--header", *headers] if headers else []),
    ]  # fmt: skip
    return parser.parse_args(flags)


def ttft_to_text(result: dict[str, Any]) -> list[float]:
    """Per request, seconds to the first chunk with text. On both servers the first chunk holds
    the role alone and the second the first text, so it is the client's TTFT (first chunk) plus
    its first inter-chunk gap: microseconds, as both send the two together."""
    return [
        ttft + (itls[0] if itls else 0.0)
        for ttft, itls, error in zip(result["ttfts"], result["itls"], result["errors"], strict=True)
        if ttft and not error
    ]


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    to_text = ttft_to_text(result)
    return {
        "completed": result["completed"],
        "failed": result["failed"],
        "output_tokens": result["total_output_tokens"],
        "output_tokens_per_s": result["output_throughput"],
        "ttft_first_chunk_p50_ms": result["median_ttft_ms"],
        "ttft_to_text_p50_ms": (percentile(to_text, 50) or 0.0) * 1000 if to_text else None,
        "tpot_p50_ms": result["median_tpot_ms"],
    }


def peer(*, rounds: int, concurrencies: list[int], input_len: int, output_len: int) -> dict[str, Any]:
    from django.conf import settings
    from vllm.benchmarks.serve import main as vllm_bench_serve

    from inference.engines.vllm import engine_args, server_flags

    max_num_seqs = max(concurrencies)
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": "vllm",
        "INFERENCE_MAX_NUM_SEQS": str(max_num_seqs),
        "VIP_RESERVED_SLOTS": "0",
        "GENERATION_TEMPERATURE": "0",
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    server = VllmServer(
        workdir / "vllm-serve",
        engine_flags=server_flags(
            engine_args(
                model_path=settings.INFERENCE_MODEL,
                max_num_seqs=max_num_seqs,
                max_model_len=settings.INFERENCE_MAX_MODEL_LEN,
                gpu_memory_utilization=settings.INFERENCE_GPU_MEMORY_UTILIZATION,
            )
        ),
        served_model_name=STABLE_VARIANT,
        kv_cache_gib=settings.INFERENCE_KV_CACHE_GIB,
    )
    chat_path = chat_dataset(workdir / "support-chats.json")
    runs: dict[str, dict[str, dict[str, list[dict]]]] = {
        target: {dataset: {} for dataset in DATASETS} for target in TARGETS
    }
    print("  starting vllm serve...", flush=True)
    server.start()
    try:
        with running(env) as stack:
            server.wait_ready()
            key = stack.create_api_key("victor")
            endpoints = {
                "product": (stack.base_url, [f"Authorization=Bearer {key}"]),
                "vllm_serve": (server.base_url, []),
            }
            for round_number in range(rounds):
                order = TARGETS if round_number % 2 == 0 else TARGETS[::-1]
                for dataset in DATASETS:
                    for concurrency in concurrencies:
                        for target in order:
                            base_url, headers = endpoints[target]
                            args = _client_args(
                                base_url=base_url,
                                model_path=settings.INFERENCE_MODEL,
                                served_model_name=STABLE_VARIANT,
                                dataset=dataset,
                                chat_path=chat_path,
                                concurrency=concurrency,
                                prompts=max(2 * concurrency, 8),
                                input_len=input_len,
                                output_len=output_len,
                                headers=headers,
                            )
                            started = time.perf_counter()
                            summary = _summary(vllm_bench_serve(args))
                            runs[target][dataset].setdefault(str(concurrency), []).append(summary)
                            print(
                                f"  round {round_number + 1} {dataset} c={concurrency} {target}: "
                                f"{summary['output_tokens_per_s']:.1f} tok/s, TTFT to text p50 "
                                f"{summary['ttft_to_text_p50_ms'] or 0:.0f} ms "
                                f"({time.perf_counter() - started:.0f} s)",
                                flush=True,
                            )
    finally:
        server.stop()
    table = {
        dataset: {str(c): _compare(runs, dataset, str(c)) for c in concurrencies} for dataset in DATASETS
    }
    return {
        "rounds": rounds,
        "input_len": input_len,
        "output_len": output_len,
        "load_average": os.getloadavg(),
        "table": table,
        "runs": runs,
    }


def _compare(runs: dict, dataset: str, concurrency: str) -> dict[str, float | None]:
    """Medians over the rounds, the product against vllm serve."""

    def median(target: str, field: str) -> float | None:
        values = [run[field] for run in runs[target][dataset][concurrency] if run[field] is not None]
        return statistics.median(values) if values else None

    product_tps, peer_tps = (
        median("product", "output_tokens_per_s"),
        median("vllm_serve", "output_tokens_per_s"),
    )
    product_ttft, peer_ttft = (
        median("product", "ttft_to_text_p50_ms"),
        median("vllm_serve", "ttft_to_text_p50_ms"),
    )
    return {
        "product_tokens_per_s": product_tps,
        "vllm_serve_tokens_per_s": peer_tps,
        "throughput_ratio": product_tps / peer_tps if product_tps and peer_tps else None,
        "product_ttft_to_text_p50_ms": product_ttft,
        "vllm_serve_ttft_to_text_p50_ms": peer_ttft,
        "added_ttft_p50_ms": product_ttft - peer_ttft
        if product_ttft is not None and peer_ttft is not None
        else None,
        "product_ttft_first_chunk_p50_ms": median("product", "ttft_first_chunk_p50_ms"),
        "vllm_serve_ttft_first_chunk_p50_ms": median("vllm_serve", "ttft_first_chunk_p50_ms"),
        "product_output_tokens": median("product", "output_tokens"),
        "vllm_serve_output_tokens": median("vllm_serve", "output_tokens"),
    }
