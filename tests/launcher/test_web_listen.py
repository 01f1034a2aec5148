"""The web process takes a burst of connections: the kernel queues what daphne has not accepted
yet instead of resetting connections whose requests were already sent."""

from __future__ import annotations

import subprocess

from launcher.stack import WEB_LISTEN_BACKLOG, Stack


def test_the_web_process_listens_with_room_for_a_burst_of_connections(tmp_path):
    stack = Stack(tmp_path, INFERENCE_ENGINE="simulated")
    try:
        stack.redis.start()
        stack.start_web()
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{stack.port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        # For a listening socket, ss shows the accept queue's size in the Send-Q column.
        state, _queued, backlog = listening[:3]
        assert (state, int(backlog)) == ("LISTEN", WEB_LISTEN_BACKLOG)
    finally:
        stack.stop()
