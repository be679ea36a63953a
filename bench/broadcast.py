"""Weight broadcast: M bytes to N receivers, real processes on loopback, each upload capped at B.

Question: how close does the pipelined swarm broadcast come to the chain bound
``(k + N - 1) * c / B``, and how much faster is it than a star (every receiver fetches from the
publisher only, same code, ``BroadcastConfig(publisher_only=True)``) whose bound is ``N * M / B``?

Every peer (publisher and receivers) is its own process with its own DataPlane, whose token
bucket caps its upload at B bytes/s; the clock starts when all are ready and stops when the
last receiver holds the whole verified blob.

    python bench/broadcast.py --peers 8                       # N=8, swarm and star
    python bench/broadcast.py --peers 2,4,8,16 --modes swarm --repeats 1 --json out.json
    python bench/broadcast.py --peers 8 --corrupt 1,2 --json out.json   # + corrupt-chunk adversary

With ``--shape 0.5b`` the blobs are a learner's versions at Qwen2.5-0.5B's shape (random weights,
no download) training LoRA (``--lora-rank``, the default target modules): the whole merged model
and the adapter alone (``swarmnode.broadcast.adapter``), each broadcast to N receivers, beside the
time a worker takes to install each (``load_blob_into`` vs ``BaseWeights.install_adapter``).

    python bench/broadcast.py --shape 0.5b --peers 2 --rate-mb 50 --json out.json

With ``--corrupt K`` (swarm mode), K of the N receivers serve every chunk with a flipped byte
(the signature on their answer is fine; only the manifest's chunk hash catches it), next to a
clean run with the same M, N, B and c. Reported per K: poisoned = honest receivers whose final
blob differs from the published one (0 if hash checks hold), blames and invalid chunks counted
by the honest receivers, and the honest receivers' completion time as a share of the clean
run's (clean seconds / attack seconds; 1.00 = the attack cost nothing).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import base_parser, machine, median, print_table, write_json
from swarmnode.broadcast.core import BroadcastConfig
from swarmnode.broadcast.driver import BroadcastNode, build_manifest
from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import DataPlane
from swarmnode.testing import Proc, spawn, wait_until
from swarmnode.testing.corrupting import CorruptingNode
from swarmnode.wire.envelope import Envelope, decode_envelope, encode_envelope
from swarmnode.wire.messages import TensorEntry

MIB = 1024 * 1024


def _seed(i: int) -> bytes:
    return hashlib.sha256(f"bench broadcast peer {i}".encode()).digest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- one peer (child)


async def _child(a: dict[str, Any]) -> None:
    identity = NodeIdentity.from_seed(bytes.fromhex(a["seed"]))
    dp = DataPlane(identity, port=a["port"], upload_rate=a["rate"])
    config = BroadcastConfig(publisher_only=a["mode"] == "star", request_timeout=120.0, queue_timeout=100.0)
    node = (CorruptingNode if a["corrupt"] else BroadcastNode)(identity, dp, config)
    await dp.start()
    await node.start()
    for peer_id, address in json.loads(Path(a["peers"]).read_text()):
        node.add_peer(peer_id, address)
    envelope = decode_envelope(Path(a["manifest"]).read_bytes())
    assert isinstance(envelope, Envelope)
    if a["blob"]:
        node.publish_prepared(Path(a["blob"]).read_bytes(), envelope)
    Path(a["out"] + ".ready").write_text("ready")
    go = Path(a["go"])
    while not go.exists():
        await asyncio.sleep(0.002)
    if not a["blob"]:
        blob = await node.receive(envelope, timeout=a["timeout"])
        done = time.time()
        # Blames are final here: a complete receiver fetches nothing more.
        result = {
            "done": done,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "blames": node.stats.blames,
            "chunks_invalid": node.stats.chunks_invalid,
        }
        Path(a["out"]).write_text(json.dumps(result))
    await asyncio.Event().wait()  # keep relaying until the parent stops us


# --------------------------------------------------------------------------- one run (parent)


def run_once(n: int, mode: str, size: int, chunk: int, rate: float, timeout: float) -> float:
    """Seconds until the last of N honest receivers holds the verified blob."""
    run = run_attack(n, 0, mode, size, chunk, rate, timeout)
    if run["poisoned"]:
        raise RuntimeError("a receiver assembled different bytes")
    return float(run["seconds"])


def run_attack(
    n: int, corrupt: int, mode: str, size: int, chunk: int, rate: float, timeout: float
) -> dict[str, Any]:
    """One broadcast in which receivers 1..corrupt corrupt every chunk they serve.

    Returns seconds (until the last honest receiver completes), poisoned (honest receivers
    whose blob differs from the published one), and blames / chunks_invalid summed over the
    honest receivers. The corrupting receivers are not waited for."""
    with tempfile.TemporaryDirectory(prefix="bench-broadcast-") as tmp_dir:
        tmp = Path(tmp_dir)
        blob = os.urandom(size)
        publisher = NodeIdentity.from_seed(_seed(0))
        _, envelope = build_manifest(
            publisher, "bench", 1, blob, (TensorEntry("w", "U8", (size,), 0, size),), chunk
        )
        (tmp / "blob").write_bytes(blob)
        (tmp / "manifest").write_bytes(encode_envelope(envelope))
        ports = [_free_port() for _ in range(n + 1)]
        peers = [[NodeIdentity.from_seed(_seed(i)).peer_id, f"127.0.0.1:{p}"] for i, p in enumerate(ports)]
        (tmp / "peers.json").write_text(json.dumps(peers))
        procs: list[Proc] = []
        try:
            for i in range(n + 1):
                args = {
                    "seed": _seed(i).hex(),
                    "port": ports[i],
                    "rate": rate,
                    "mode": mode,
                    "peers": str(tmp / "peers.json"),
                    "manifest": str(tmp / "manifest"),
                    "blob": str(tmp / "blob") if i == 0 else "",
                    "out": str(tmp / f"out{i}"),
                    "corrupt": 1 <= i <= corrupt,
                    "go": str(tmp / "go"),
                    "timeout": timeout,
                }
                procs.append(spawn(f"peer{i}", [__file__, "--child", json.dumps(args)], tmp / f"peer{i}.log"))
            wait_until(
                lambda: all((tmp / f"out{i}.ready").exists() for i in range(n + 1)),
                120,
                "every peer process to start",
                procs=procs,
                interval=0.01,
            )
            t0 = time.time()
            (tmp / "go").write_text("go")
            outs = [tmp / f"out{i}" for i in range(corrupt + 1, n + 1)]
            wait_until(
                lambda: all(o.exists() for o in outs),
                timeout,
                f"the {mode} broadcast to {n} receivers",
                procs=procs,
                interval=0.01,
            )
            expected = hashlib.sha256(blob).hexdigest()
            results = [json.loads(o.read_text()) for o in outs]
            return {
                "seconds": max(r["done"] for r in results) - t0,
                "poisoned": sum(r["sha256"] != expected for r in results),
                "blames": sum(r["blames"] for r in results),
                "chunks_invalid": sum(r["chunks_invalid"] for r in results),
                "honest": len(results),
            }
        finally:
            for p in procs:  # all at once: the relays run until stopped
                p.kill_group(signal.SIGTERM)
            for p in procs:
                p.wait_stopped(10)


def main() -> None:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default="8", help="receiver counts N, comma-separated (e.g. 2,4,8,16)")
    parser.add_argument("--modes", default="swarm,star", help="swarm, star or both")
    parser.add_argument("--mib", type=float, default=16.0, help="M: blob size in MiB")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="c: chunk size in KiB")
    parser.add_argument(
        "--rate-mb", type=float, default=4.0, help="B: each peer's upload cap in MB/s (1e6 bytes)"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--corrupt",
        default="",
        help="K: corrupting receivers, comma-separated (e.g. 1,2); runs the adversary table instead",
    )
    parser.add_argument(
        "--shape", choices=["0.5b", "small"], help="full vs adapter versions of a model of this shape"
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="r of the adapter (--shape)")
    parser.add_argument("--child", help=argparse_hidden())
    parser.set_defaults(repeats=1)
    args = parser.parse_args()
    if args.child:
        # Each blame is also logged as a warning by every honest receiver; the table counts them.
        logging.getLogger("swarmnode").setLevel(logging.ERROR)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(_child(json.loads(args.child)))
        return
    size = int(args.mib * MIB)
    chunk = args.chunk_kib * 1024
    rate = args.rate_mb * 1e6
    k = -(-size // chunk)
    if args.corrupt:
        corrupt_table(args, size, chunk, rate, k)
        return
    if args.shape:
        adapter_table(args, chunk, rate)
        return
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    for n in [int(x) for x in args.peers.split(",")]:
        chain = (k + n - 1) * chunk / rate
        star = n * size / rate
        measured: dict[str, float] = {}
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            times = [run_once(n, mode, size, chunk, rate, args.timeout) for _ in range(args.repeats)]
            measured[mode] = median(times)
            figures.append(
                {
                    "n": n,
                    "mode": mode,
                    "seconds": times,
                    "median": measured[mode],
                    "chain_bound": chain,
                    "star_bound": star,
                    "fluid_bound": size / rate,
                }
            )
            rows.append(
                [
                    n,
                    mode,
                    f"{measured[mode]:.2f}",
                    f"{chain:.2f}",
                    f"{measured[mode] / chain:.2f}",
                    f"{star:.2f}",
                    f"{star / measured[mode]:.2f}",
                ]
            )
        if "swarm" in measured and "star" in measured:
            rows.append([n, "star/swarm", f"{measured['star'] / measured['swarm']:.2f}x", "", "", "", ""])
    print_table(
        f"weight broadcast: M={args.mib:g} MiB, c={args.chunk_kib} KiB (k={k}), "
        f"B={args.rate_mb:g} MB/s per peer",
        ["N", "mode", "seconds", "chain_bound", "vs_chain", "star_bound", "star_bound/measured"],
        rows,
        [
            f"machine: {machine()['cores']} cores; repeats={args.repeats} (median)",
            "chain bound (k+N-1)c/B; star bound N*M/B; "
            "every peer a process, upload capped by its token bucket",
        ],
    )
    write_json(args.json, {"settings": vars(args) | {"k": k}, "machine": machine(), "results": figures})


def _attack_row(n: int, k: int, runs: list[dict[str, Any]], seconds: float, share: float) -> list[Any]:
    counts = [sum(r[key] for r in runs) for key in ("poisoned", "blames", "chunks_invalid")]
    return [n, k, n - k, *counts, f"{seconds:.2f}", f"{share:.2f}"]


def corrupt_table(args: Any, size: int, chunk: int, rate: float, k: int) -> None:
    """Swarm mode only: per N, a clean run, then one run per K corrupting receivers."""
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    for n in [int(x) for x in args.peers.split(",")]:
        clean = [run_attack(n, 0, "swarm", size, chunk, rate, args.timeout) for _ in range(args.repeats)]
        clean_s = median([r["seconds"] for r in clean])
        figures.append({"n": n, "corrupt": 0, "runs": clean, "median": clean_s})
        rows.append(_attack_row(n, 0, clean, clean_s, 1.0))
        for kk in [int(x) for x in args.corrupt.split(",")]:
            if not 0 < kk < n:
                raise SystemExit(f"--corrupt {kk}: needs 0 < K < N={n}")
            runs = [run_attack(n, kk, "swarm", size, chunk, rate, args.timeout) for _ in range(args.repeats)]
            attack_s = median([r["seconds"] for r in runs])
            share = clean_s / attack_s
            figures.append({"n": n, "corrupt": kk, "runs": runs, "median": attack_s, "share_of_clean": share})
            rows.append(_attack_row(n, kk, runs, attack_s, share))
    print_table(
        f"corrupt-chunk adversary: M={args.mib:g} MiB, c={args.chunk_kib} KiB (k={k}), "
        f"B={args.rate_mb:g} MB/s per peer, swarm mode",
        ["N", "K", "honest", "poisoned", "blames", "invalid_chunks", "honest_seconds", "clean/attack"],
        rows,
        [
            f"machine: {machine()['cores']} cores; repeats={args.repeats} (median; counts summed)",
            "K receivers serve every chunk with a flipped byte; poisoned = honest receivers whose "
            "blob differs from the published one; blames, invalid chunks: seen by honest receivers",
        ],
    )
    write_json(args.json, {"settings": vars(args) | {"k": k}, "machine": machine(), "results": figures})


def lora_versions(shape: str, rank: int) -> dict[str, Any]:
    """A LoRA learner's version at ``shape`` (adapters as after training): its whole and adapter
    blobs, and a worker's install time for each (median of 3; the adapter's first install, which
    copies the adapted weights' base, apart)."""

    from bench.memory import model_of_shape
    from swarmnode.broadcast.adapter import BaseWeights
    from swarmnode.broadcast.driver import load_blob_into, publishable, state_dict_to_blob
    from swarmnode.config import DEFAULT_LORA_TARGETS
    from swarmnode.policy.lora import apply_lora, broadcast_adapter, merged_state_dict, plain_copy

    base = model_of_shape(shape)
    worker = plain_copy(base)
    learner = apply_lora(base, rank, 2.0 * rank, list(DEFAULT_LORA_TARGETS))
    with torch.no_grad():
        for name, p in learner.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1e-3)
    whole_blob, whole_tensors = state_dict_to_blob(publishable(merged_state_dict(learner)))
    adapter, scale = broadcast_adapter(learner)
    adapter_blob, _ = state_dict_to_blob(adapter)
    installs: dict[str, list[float]] = {"whole": [], "adapter": []}
    holder = BaseWeights(worker)
    holder.hash  # noqa: B018  # at start, as a worker does
    t0 = time.perf_counter()
    holder.install_adapter(adapter, holder.hash, scale)
    first_adapter = time.perf_counter() - t0
    for _ in range(3):
        t0 = time.perf_counter()
        holder.install_adapter(adapter, holder.hash, scale)
        installs["adapter"].append(time.perf_counter() - t0)
    for _ in range(3):
        t0 = time.perf_counter()
        load_blob_into(worker, whole_blob, whole_tensors)
        installs["whole"].append(time.perf_counter() - t0)
    return {
        "parameters": sum(p.numel() for p in worker.parameters()),
        "adapter_parameters": sum(t.numel() for t in adapter.values()),
        "bytes": {"whole": len(whole_blob), "adapter": len(adapter_blob)},
        "install_seconds": {k: median(v) for k, v in installs.items()},
        "first_adapter_install_seconds": first_adapter,
    }


def adapter_table(args: Any, chunk: int, rate: float) -> None:
    """Whole vs adapter versions of one LoRA learner: bytes, broadcast time to N, install time."""
    versions = lora_versions(args.shape, args.lora_rank)
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    for n in [int(x) for x in args.peers.split(",")]:
        for kind in ("whole", "adapter"):
            size = versions["bytes"][kind]
            k = -(-size // chunk)
            times = [run_once(n, "swarm", size, chunk, rate, args.timeout) for _ in range(args.repeats)]
            chain = (k + n - 1) * min(chunk, size) / rate
            install = versions["install_seconds"][kind]
            figures.append(
                {"n": n, "kind": kind, "bytes": size, "seconds": times, "median": median(times),
                 "chain_bound": chain, "install_seconds": install}
            )  # fmt: skip
            rows.append(
                [n, kind, f"{size / 1e6:.1f}", f"{median(times):.2f}", f"{chain:.2f}", f"{install:.3f}"]
            )
        whole, adapter = figures[-2], figures[-1]
        rows.append(
            [n, "whole/adapter", f"{whole['bytes'] / adapter['bytes']:.1f}x",
             f"{whole['median'] / adapter['median']:.1f}x", "", ""]
        )  # fmt: skip
    print_table(
        f"LoRA versions at the {args.shape} shape ({versions['parameters'] / 1e6:.0f} M parameters, "
        f"r={args.lora_rank}: {versions['adapter_parameters'] / 1e6:.2f} M in the adapter), "
        f"c={args.chunk_kib} KiB, B={args.rate_mb:g} MB/s per peer, swarm mode",
        ["N", "version", "MB", "broadcast_s", "chain_bound_s", "install_s"],
        rows,
        [
            f"machine: {machine()['cores']} cores; repeats={args.repeats} (median)",
            "install: a worker's swap once the blob is here (whole: copy every tensor in; adapter: "
            f"W + s * B @ A for each adapted weight); the adapter's first install, which also copies "
            f"the adapted weights' base, took {versions['first_adapter_install_seconds']:.3f} s",
        ],
    )
    write_json(
        args.json, {"settings": vars(args), "machine": machine(), "versions": versions, "results": figures}
    )


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
