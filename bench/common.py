"""Shared helpers for benchmarks: machine facts, medians, tables and --json output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import torch


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
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
