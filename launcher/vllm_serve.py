"""vLLM's own OpenAI server beside the product: the peer that the differential tests and
`bench peer` compare the product's /v1 with. It is started as
`python -m vllm.entrypoints.openai.api_server`, which works whatever the `vllm` script does, with
engine flags the caller takes from the worker's engine (`inference.engines.vllm.server_flags`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx

from launcher.process import Process, free_port
from launcher.stack import inherited_env

# Loading the model and sizing the KV cache takes 30-60 s on a busy CPU.
START_TIMEOUT_S = 300.0


class VllmServer:
    def __init__(
        self,
        workdir: Path,
        *,
        engine_flags: list[str],
        served_model_name: str,
        kv_cache_gib: int,
        server_flags: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--served-model-name", served_model_name,
            *engine_flags,
            *server_flags,
        ]  # fmt: skip
        # On CPU, vLLM sizes its KV cache from this variable alone, as the worker's engine does.
        self.env = inherited_env(VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib))
        self.process: Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "vllm-serve.log"

    def start(self) -> None:
        """Start the server without waiting for it: the model loads while the caller goes on."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = Process("vllm-serve", self.command, env=self.env, output=self.log_path)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the server answers /health; if it never does, it is stopped first."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        try:
            while not self._healthy():
                if not self.process.running():
                    raise RuntimeError(f"vllm serve exited with {self.process.stop()}; see {self.log_path}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vllm serve was not up after {timeout_s}s; see {self.log_path}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
