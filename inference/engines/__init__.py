"""Engine selection: INFERENCE_ENGINE picks `vllm` (production) or `simulated` (tests)."""

from django.conf import settings

from inference.engines.base import Engine


def build_engine() -> Engine:
    if settings.INFERENCE_ENGINE == "simulated":
        from inference.engines.simulated import SimulatedEngine

        return SimulatedEngine(
            max_num_seqs=settings.INFERENCE_MAX_NUM_SEQS,
            prefill_s_per_token=settings.SIMULATED_PREFILL_S_PER_TOKEN,
            decode_base_s=settings.SIMULATED_DECODE_BASE_S,
            decode_per_seq_s=settings.SIMULATED_DECODE_PER_SEQ_S,
            output_tokens=settings.SIMULATED_OUTPUT_TOKENS,
            failure_rate=settings.SIMULATED_FAILURE_RATE,
            start_s=settings.SIMULATED_START_S,
        )
    if settings.INFERENCE_ENGINE == "vllm":
        from inference.engines.vllm import VllmEngine

        return VllmEngine(
            model_path=settings.INFERENCE_MODEL,
            max_num_seqs=settings.INFERENCE_MAX_NUM_SEQS,
            max_model_len=settings.INFERENCE_MAX_MODEL_LEN,
            gpu_memory_utilization=settings.INFERENCE_GPU_MEMORY_UTILIZATION,
            kv_cache_space_gib=settings.INFERENCE_KV_CACHE_GIB,
        )
    raise ValueError(f"INFERENCE_ENGINE must be 'vllm' or 'simulated', not {settings.INFERENCE_ENGINE!r}")
