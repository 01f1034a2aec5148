"""nginx in front of several web processes, with the project's own config (deploy/nginx.conf).

Only where it listens, the web processes it balances, and where it keeps its own files change;
every location and timeout is the deployed one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from launcher.process import LOCAL, ROOT, Output, Place, Process, wait_for_port

DEPLOY_CONFIG = ROOT / "deploy" / "nginx.conf"


def nginx_config(*, listen: str, upstreams: list[str], workdir: Path) -> str:
    """deploy/nginx.conf listening on `listen` (address:port) in front of `upstreams`
    (address:port each), with its pid, logs and temporary files in `workdir`."""
    config = DEPLOY_CONFIG.read_text()
    servers = "".join(f"        server {upstream};\n" for upstream in upstreams)
    config, balanced = re.subn(
        r"(upstream support_chat_web \{\n)(?:\s*#.*\n)?(?:\s*server .*;\n)+", rf"\1{servers}", config
    )
    config, listening = re.subn(r"listen 80;", f"listen {listen};", config)
    if (balanced, listening) != (1, 1):
        raise RuntimeError(f"{DEPLOY_CONFIG} no longer has the upstream block and listen line this expects")
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
        self, workdir: Path, *, port: int, upstreams: list[str], place: Place = LOCAL, output: Output = None
    ) -> None:
        binary = shutil.which("nginx")
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx)")
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.upstreams = upstreams
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
                listen=f"{self.place.address}:{self.port}", upstreams=self.upstreams, workdir=self.workdir
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
