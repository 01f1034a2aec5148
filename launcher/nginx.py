"""nginx in front of several web processes, with the project's own config (deploy/nginx.conf).

Only where it listens (plain HTTP on one address: no TLS, no redirect from port 80), the web
processes it balances, where it keeps its own files, the per-address limits (off: a test's or a
benchmark's load comes from one address) and, for web processes with another SSE heartbeat, the
streams' read timeout change; every other location and timeout is the deployed one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from launcher.process import LOCAL, ROOT, Output, Place, Process, wait_for_port

DEPLOY_CONFIG = ROOT / "deploy" / "nginx.conf"
# A stream whose web process has written nothing, not even a heartbeat, for this many heartbeat
# intervals is ended: its host is gone, and the browser resumes it through another.
STREAM_SILENT_HEARTBEATS = 3
# The answer streams' location and the hand-off events' one.
_STREAM_READ_TIMEOUT = re.compile(
    r"(location (?:/chat/stream/|~ \^/chat/\[0-9a-f-\]\+/events\$) \{[^}]*?proxy_read_timeout )[^;]+;"
)


def nginx_config(
    *, listen: str, upstreams: list[str], workdir: Path, sse_heartbeat_s: float | None = None
) -> str:
    """deploy/nginx.conf listening on `listen` (address:port) in front of `upstreams`
    (address:port each), with its pid, logs and temporary files in `workdir`; for web processes
    whose SSE_HEARTBEAT_S is `sse_heartbeat_s`, streams silent for three heartbeats end."""
    config = DEPLOY_CONFIG.read_text()
    servers = "".join(f"        server {upstream};\n" for upstream in upstreams)
    config, balanced = re.subn(
        r"(upstream support_chat_\w+ \{\n)(?:\s*#.*\n)?(?:\s*server .*;\n)+", rf"\1{servers}", config
    )
    config, redirects = re.subn(
        r"\n    # Plain HTTP only sends browsers to HTTPS\.\n    server \{[^}]*\}\n", "\n", config
    )
    config, listening = re.subn(r"listen 443 ssl;", f"listen {listen};", config)
    config = re.sub(r"\n\s*listen \[::\]:443 ssl;", "", config)
    config = re.sub(r"\n\s*ssl_[a-z_]+ [^;]*;", "", config)
    config = re.sub(r"\n\s*limit_(?:conn|req) (?:per_address|zone=)[^;]*;", "", config)

    def stream_read_timeout(match: re.Match[str]) -> str:
        if sse_heartbeat_s is None:
            return match.group(0)
        return f"{match.group(1)}{round(STREAM_SILENT_HEARTBEATS * sse_heartbeat_s * 1000)}ms;"

    config, timed = _STREAM_READ_TIMEOUT.subn(stream_read_timeout, config)
    if (balanced, redirects, listening, timed) != (2, 1, 1, 2):
        raise RuntimeError(
            f"{DEPLOY_CONFIG} no longer has the upstream blocks, listen line and stream timeouts this expects"
        )
    local_files = "".join(
        f"    {directive} {workdir / name};\n"
        for directive, name in (
            ("access_log", "access.log"),
            ("client_body_temp_path", "client_body"),
            ("proxy_temp_path", "proxy"),
            ("fastcgi_temp_path", "fastcgi"),
            ("uwsgi_temp_path", "uwsgi"),
            ("scgi_temp_path", "scgi"),
        )
    )
    return f"pid {workdir / 'nginx.pid'};\n" + config.replace("http {\n", "http {\n" + local_files, 1)


class Nginx:
    def __init__(
        self,
        workdir: Path,
        *,
        port: int,
        upstreams: list[str],
        sse_heartbeat_s: float | None = None,
        place: Place = LOCAL,
        output: Output = None,
    ) -> None:
        binary = shutil.which("nginx")
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.upstreams = upstreams
        self.sse_heartbeat_s = sse_heartbeat_s
        self.place = place
        self.output = output
        self.process: Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.place.address}:{self.port}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "nginx.conf"
        config.write_text(
            nginx_config(
                listen=f"{self.place.address}:{self.port}",
                upstreams=self.upstreams,
                workdir=self.workdir,
                sse_heartbeat_s=self.sse_heartbeat_s,
            )
        )
        command = [self.binary, "-c", str(config), "-e", str(self.workdir / "error.log"), "-g", "daemon off;"]
        self.process = Process("nginx", self.place.command(command), env=dict(os.environ), output=self.output)
        try:
            wait_for_port(self.port, process=self.process, host=self.place.address)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None
