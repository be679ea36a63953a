"""Soak: bootstrap + N nodes (`swarmnode swarm`) for a while; resident memory and open files per node.

Samples every node process (and its p2pd child) from /proc every --every seconds
and prints start / end / max per node, so "memory stays bounded" is a figure,
not a claim. Linux only (reads /proc).

    python bench/soak.py --nodes 4 --minutes 30 [--json out.json]
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, print_table, write_json

from swarmnode.testing import spawn


def find_node_pids(root: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "run" in words and "--home" in words:
            home = Path(words[words.index("--home") + 1])
            if home.parent.resolve() == root.resolve():
                found[home.name] = int(entry.name)
    return found


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def node_counters(home: Path) -> dict[str, float]:
    """Task restarts, published groups and rounds from the node's own /metrics (NaN if unreachable)."""
    wanted = {
        "swarmnode_task_restarts_total": "restarts",
        "swarmnode_groups_published_total": "groups_published",
        "swarmnode_rounds_total": "rounds",
    }
    out = {v: float("nan") for v in wanted.values()}
    try:
        port = int((home / "api.port").read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except (OSError, ValueError):
        return out
    for v in wanted.values():
        out[v] = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            out[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return out


def sample(pids: dict[str, int], root: Path) -> dict[str, dict[str, float]]:
    out = {}
    for name, pid in pids.items():
        kids = children(pid)
        out[name] = {
            "rss_mib": rss_mib(pid),
            "children_rss_mib": sum(rss_mib(k) for k in kids),
            "fds": open_files(pid),
            **node_counters(root / name),
        }
    return out


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--home", default="runs/soak")
    args = parser.parse_args()
    root = Path(args.home)
    log = root.with_suffix(".log")
    swarm = spawn(
        "swarm",
        [
            "-m",
            "swarmnode.cli",
            "swarm",
            "--home",
            str(root),
            "--nodes",
            str(args.nodes),
            "--minutes",
            str(args.minutes),
        ],
        log,
    )
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        pids: dict[str, int] = {}
        while swarm.alive():
            pids = find_node_pids(root) or pids
            if len(pids) == args.nodes:
                samples.append({"t": round(time.monotonic() - t0, 1), "nodes": sample(pids, root)})
                print(
                    f"t={samples[-1]['t']:7.1f}s "
                    + "  ".join(
                        f"{n}: {v['rss_mib']:.0f}+{v['children_rss_mib']:.0f} MiB {v['fds']:.0f} fds "
                        f"{v['groups_published']:.0f} groups {v['restarts']:.0f} restarts"
                        for n, v in sorted(samples[-1]["nodes"].items())
                    ),
                    flush=True,
                )
            time.sleep(args.every if len(pids) == args.nodes else 2.0)
    except KeyboardInterrupt:
        pass
    swarm.stop(timeout=300)  # SIGINT to the swarm's group (a clean stop), SIGKILL after 300 s
    # Before p2pd is up a node is still importing: start-up, not steady state.
    samples = [s for s in samples if all(v["children_rss_mib"] > 0 for v in s["nodes"].values())]
    if len(samples) < 2:
        print(f"not enough samples (did the swarm start? see {log})")
        return
    first, last = samples[0]["nodes"], samples[-1]["nodes"]
    rows = []
    # Rollout rate per node in the first and the last quarter of the run: "stable" is a figure.
    quarter = max(1, len(samples) // 4)

    def rate(name: str, part: list[dict[str, Any]]) -> float:
        a, b = part[0], part[-1]
        dt = b["t"] - a["t"]
        grown = b["nodes"][name]["groups_published"] - a["nodes"][name]["groups_published"]
        return grown / dt if dt else 0.0

    for name in sorted(first):
        peak = max(s["nodes"][name]["rss_mib"] for s in samples if name in s["nodes"])
        rows.append(
            [
                name,
                f"{first[name]['rss_mib']:.0f}",
                f"{last[name]['rss_mib']:.0f}",
                f"{peak:.0f}",
                f"{first[name]['children_rss_mib']:.0f} -> {last[name]['children_rss_mib']:.0f}",
                f"{first[name]['fds']:.0f} -> {last[name]['fds']:.0f}",
                f"{rate(name, samples[: quarter + 1]):.2f} -> {rate(name, samples[-quarter - 1 :]):.2f}",
                f"{last[name]['restarts']:.0f}",
            ]
        )
    print_table(
        f"soak: {args.nodes} nodes for {samples[-1]['t'] / 60:.1f} min (first sample after start-up)",
        [
            "node",
            "RSS start MiB",
            "RSS end MiB",
            "RSS max MiB",
            "p2pd RSS MiB",
            "open fds",
            "groups/s first -> last quarter",
            "task restarts",
        ],
        rows,
        [f"machine: {machine()['cores']} cores; every process of the swarm shares them"],
    )
    write_json(args.json, {"bench": "soak", "machine": machine(), "samples": samples})


if __name__ == "__main__":
    main()
