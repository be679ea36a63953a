"""A small metrics registry rendered in the Prometheus text exposition format (0.0.4).

Owns: counters and gauges with labels, and their text rendering. Kept in-house
because the node needs a dozen series and no extra dependency.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class Series:
    name: str
    kind: str  # "counter" | "gauge"
    help: str
    values: dict[Labels, float] = field(default_factory=dict)


class Metrics:
    """Thread-safe: the training thread and the event loop both update it."""

    def __init__(self, prefix: str = "swarmnode") -> None:
        self.prefix = prefix
        self._series: dict[str, Series] = {}
        self._lock = threading.Lock()

    def _get(self, name: str, kind: str, help: str) -> Series:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = Series(f"{self.prefix}_{name}", kind, help)
        elif series.kind != kind:
            raise ValueError(f"metric {name} is a {series.kind}, not a {kind}")
        return series

    def inc(self, name: str, help: str, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"counter {name} cannot decrease")
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._get(name, "counter", help)
            series.values[key] = series.values.get(key, 0.0) + amount

    def set(self, name: str, help: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._get(name, "gauge", help).values[key] = float(value)

    def value(self, name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._series.get(name)
            return 0.0 if series is None else series.values.get(key, 0.0)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{name: {"label=value,...": value}}``, for /status."""
        with self._lock:
            return {
                name: {",".join(f"{k}={v}" for k, v in labels): value for labels, value in s.values.items()}
                for name, s in self._series.items()
            }

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for series in sorted(self._series.values(), key=lambda s: s.name):
                full = series.name + ("_total" if series.kind == "counter" else "")
                lines.append(f"# HELP {full} {series.help}")
                lines.append(f"# TYPE {full} {series.kind}")
                for labels, value in sorted(series.values.items()):
                    label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    lines.append(
                        f"{full}{{{label_text}}} {_fmt_value(value)}"
                        if labels
                        else f"{full} {_fmt_value(value)}"
                    )
        return "\n".join(lines) + "\n"
