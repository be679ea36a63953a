"""A minimal node for process tests: one HivemindRuntime with a persistent identity.

Run as ``python -m tests.net.node_process --home DIR --ready-file F [--peer MADDR]``.
Writes JSON (peer id, pid, p2pd pid, start seconds) to the ready file once up,
then serves until SIGTERM/SIGINT and stops cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path

from swarmnode.net.config import NetConfig, default_identity_path
from swarmnode.net.hivemind_runtime import HivemindRuntime


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--peer", action="append", default=[])
    args = parser.parse_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    t0 = time.perf_counter()
    config = NetConfig(
        identity_path=default_identity_path(args.home),
        host_maddrs=("/ip4/127.0.0.1/tcp/0",),
        initial_peers=tuple(args.peer),
    )
    async with await HivemindRuntime.create(config) as runtime:
        ready = {
            "peer_id": runtime.peer_id,
            "pid": os.getpid(),
            "p2pd_pid": runtime.p2pd_pid,
            "start_s": time.perf_counter() - t0,
            "maddrs": runtime.visible_maddrs,
            "death_signal": runtime.death_signal_active,
        }
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(json.dumps(ready))
        os.replace(tmp, args.ready_file)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
