"""Figures of a network-mode run (matplotlib, Agg backend: no display needed).

Owns: turning ``results.json`` content into PNGs. Must not: compute figures (the layers do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmnode.sim import sim_extra_missing


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # installed without the simulator's extra
        raise sim_extra_missing("matplotlib") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rounds(path: Path, rounds: list[Any], title: str) -> Path:
    """A node's learning curves from its ledger's rounds (``store.RoundRecord``): mean reward of its
    own completions per round (with a 20-round moving mean) and greedy held-out accuracy, per task
    family when there are several."""
    if not rounds:
        raise ValueError("the ledger has no rounds yet")
    plt = pyplot()
    fig, (ax_r, ax_h) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = [r.round for r in rounds]
    reward = [r.mean_reward for r in rounds]
    ax_r.plot(x, reward, color="#9ecae1", linewidth=0.8, label="per round")
    window = 20
    if len(reward) >= window:
        moving = [sum(reward[i - window + 1 : i + 1]) / window for i in range(window - 1, len(reward))]
        ax_r.plot(x[window - 1 :], moving, color="#1f77b4", label=f"{window}-round mean")
    ax_r.set_title("mean reward of own completions", fontsize=10)
    ax_r.set_xlabel("round")
    ax_r.legend(fontsize=8)
    ax_r.grid(alpha=0.3)
    held = [(r.round, r.extra["heldout_accuracy"]) for r in rounds if "heldout_accuracy" in r.extra]
    families = sorted({k for r in rounds for k in r.extra if k.startswith("heldout/")})
    if held:
        ax_h.plot(*zip(*held, strict=True), marker=".", label="mean", color="black")
    for key in families:
        points = [(r.round, r.extra[key]) for r in rounds if key in r.extra]
        ax_h.plot(*zip(*points, strict=True), marker=".", linewidth=1, label=key.removeprefix("heldout/"))
    ax_h.set_title("greedy held-out accuracy", fontsize=10)
    ax_h.set_xlabel("round")
    ax_h.set_ylim(0, 1.02)
    ax_h.grid(alpha=0.3)
    if held or families:
        ax_h.legend(fontsize=8)
    else:
        ax_h.text(0.5, 0.5, "not evaluated (tasks.heldout_size = 0)", ha="center", transform=ax_h.transAxes)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(results: dict[str, Any], out_dir: Path) -> list[Path]:
    written: list[Path] = []
    if "broadcast" in results:
        written.append(plot_broadcast(results["broadcast"], out_dir / "broadcast_completion.png"))
    if results.get("gossip", {}).get("latency_cdf"):
        written.append(plot_gossip_latency(results["gossip"], out_dir / "gossip_latency.png"))
    if "activation" in results:
        written.append(plot_activation(results["activation"], out_dir / "activation_utilization_cost.png"))
    return written


def plot_broadcast(b: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    times = b["completion_times"]
    n = max(1, b["receivers_alive"])
    if times:
        xs = [0.0, *times]
        ys = [0.0, *[(i + 1) / n for i in range(len(times))]]
        ax.step(xs, ys, where="post", label="simulated (real BroadcastCore)", color="C0", lw=2)
    bounds = b["bounds_seconds"]
    styles = {
        "fluid": ("fluid bound", "C2", "--"),
        "chain": ("chain pipeline", "C1", ":"),
        "star": ("star", "C3", "-."),
    }
    right = max(times) if times else 1.0
    for key, (label, color, ls) in styles.items():
        value = bounds.get(key)
        if value is None:
            continue
        if value <= 3 * right:
            ax.axvline(value, color=color, ls=ls, label=f"{label}: {value:.0f} s")
        else:
            ax.plot([], [], color=color, ls=ls, label=f"{label}: {value:.0f} s (off scale)")
    ax.set_xlim(0, max(right, min(bounds.get("chain", right), 3 * right)) * 1.05)
    ax.set_xlabel("seconds since the broadcast started (virtual)")
    ax.set_ylabel("receivers with the complete version")
    mb = b["bytes"] / 2**20
    ax.set_title(f"{mb:.0f} MiB to {b['receivers_alive']} receivers, {b['chunks']} chunks")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gossip_latency(g: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cdf = g["latency_cdf"]
    ax.plot([p[0] for p in cdf], [p[1] for p in cdf], color="C0", lw=2, label="honest items")
    q = g["latency_seconds"]
    ax.axvline(q["p50"], color="C1", ls=":", label=f"p50 {q['p50']:.2f} s")
    ax.axvline(q["p99"], color="C3", ls="--", label=f"p99 {q['p99']:.2f} s")
    ax.axvline(g["round_seconds"], color="grey", ls="-.", label=f"round {g['round_seconds']:g} s")
    ax.set_xlabel("publish -> admitted at a peer (virtual seconds)")
    ax.set_ylabel("fraction of deliveries")
    cov = g.get("coverage_mean")
    ax.set_title(
        f"gossip latency, {g['deliveries']} deliveries" + (f", coverage {cov:.1%}" if cov is not None else "")
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_activation(a: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, run in enumerate(a["policies"]):
        color = f"C{i % 10}"
        ax.scatter(
            run["cost_per_step"], run["utilization"], color=color, s=50, label=f"{run['policy']} (simulated)"
        )
        pred = run["predicted"]
        ax.scatter(pred["cost_per_step"], pred["utilization"], color=color, marker="x", s=60)
        ax.plot([run["cost_per_step"], pred["cost_per_step"]], [run["utilization"], pred["utilization"]],
                color=color, lw=0.8, alpha=0.6)  # fmt: skip
    ax.scatter([], [], color="k", marker="x", label="predicted: min(1, RT/B), sum(c r) max(T, B/R)")
    ax.set_xlabel("cost per learner step (price units)")
    ax.set_ylabel("learner utilization")
    ax.set_ylim(0, 1.05)
    ax.set_title("activation policies: utilization against cost")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
