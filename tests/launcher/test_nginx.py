"""nginx as `make run` and the multi-host test start it (launcher/nginx.py, deploy/nginx.conf):
the chat page and everything it links to come through it."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from launcher.nginx import STREAM_SILENT_HEARTBEATS, Nginx, nginx_config
from launcher.process import free_port
from launcher.stack import Stack
from tests.e2e.client import chat_page_assets_check


@pytest.fixture
def nginx_in_front(tmp_path):
    stack = Stack(tmp_path, INFERENCE_ENGINE="simulated")
    nginx = Nginx(tmp_path / "nginx", port=free_port(), upstreams=[f"127.0.0.1:{stack.port}"])
    try:
        stack.start(worker=False)
        nginx.start()
        yield nginx
    finally:
        nginx.stop()
        stack.stop()


def test_the_chat_page_loads_its_styles_and_scripts_through_nginx(nginx_in_front):
    chat_page_assets_check(nginx_in_front.base_url)


def test_streams_silent_for_three_heartbeats_are_ended(tmp_path):
    def stream_read_timeout(config: str) -> str:
        stream = config[config.index("location /chat/stream/") :]
        return re.search(r"proxy_read_timeout (\S+);", stream[: stream.index("}")]).group(1)

    deployed = nginx_config(listen="127.0.0.1:80", upstreams=["127.0.0.1:8001"], workdir=tmp_path)
    assert stream_read_timeout(deployed) == f"{STREAM_SILENT_HEARTBEATS * settings.SSE_HEARTBEAT_S:g}s"
    fast = nginx_config(
        listen="127.0.0.1:80", upstreams=["127.0.0.1:8001"], workdir=tmp_path, sse_heartbeat_s=0.5
    )
    assert stream_read_timeout(fast) == "1500ms"
