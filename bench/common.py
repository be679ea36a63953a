"""Shared helpers for benchmarks: machine facts, medians, tables and --json output."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

#: The references' libraries: a ratio to TRL or to ``generate`` moves with their versions too.
REFERENCE_PACKAGES = ("transformers", "trl", "accelerate", "datasets")


def machine() -> dict[str, Any]:
    versions = {}
    for package in REFERENCE_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "packages": versions,
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    return parser


def print_table(title: str, header: list[str], rows: list[list[Any]], notes: list[str]) -> None:
    print(title)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
    for note in notes:
        print(note)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=1), encoding="utf-8")


def matmul_gflops(m: int, k: int, n: int, repeats: int = 20) -> float:
    """Median GFLOP/s of ``torch.mm`` (m x k) @ (k x n) in float32 on the current threads: the
    arithmetic roofline a model's matmuls of that shape can reach on this machine."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - started)
    return 2 * m * k * n / median(times) / 1e9


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters a token's forward multiplies through (the input embedding is a lookup; a tied
    lm head is counted once, as the output projection)."""
    embedding = model.get_input_embeddings().weight.numel()  # type: ignore[operator]
    return sum(p.numel() for p in model.parameters()) - embedding
