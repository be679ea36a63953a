"""Gossip latency and cost: publication to admission by every peer, over the real exchange path.

Question: from the moment a node hands a signed RolloutBatch to its ``GossipDriver``, how long
until each other node has admitted it (per peer, and until the last peer), beside the floor the
protocol's own timers set; and what the exchange costs each node in CPU and resident memory.

Setup, all real and on 127.0.0.1 only: one bootstrap process (``python -m
swarmnode.roles.bootstrap``) and ``--nodes`` node processes. Each node runs ``HivemindRuntime`` +
``GossipCore`` + ``GossipDriver`` + ``AdmissionPipeline`` wired as ``SwarmNode._run_jobs`` wires
them (the same ``GossipConfig`` rule for the read interval, ``AdmissionConfig(allowed_tasks=
task_families(mixture))``, ``digest_of=envelope_digest``), but without a model: once per swarm
round, at a random offset in ``[0, read interval)`` (so peers' read timers meet a publication at a
uniformly random phase), each node seals and publishes one RolloutBatch built by
``node.rollout_batch`` from groups of real tasks of its own ``default_mixture`` stream (task seed =
node index, as the main job's nodes use). Completions are the right answer or wrong ones, scored
by the real verifier; every receiver regenerates each task and re-scores every completion in
admission. Two thin subclasses only record what happens: ``TimedAdmission`` (when each batch
was admitted, admission CPU) and ``TimedRuntime`` (durations and outcomes of announcement
stores, reads and pulls), so a batch a peer never admitted is traced to where it stopped.
Not wired, because nothing here uses them: the node's SQLite ledger (written only on rejections
and bans) and its model (``to_scored`` re-tokenizes with the policy's tokenizer; a byte-level
stand-in does here).

Latency: publishers record the wall time of ``driver.publish``; receivers the wall time at which
admission accepted the batch (one machine, one clock). A batch some peer never admitted counts as
infinitely late ("never"), so it shows in the percentiles; the first ``--warmup-rounds`` rounds
(routing tables filling, first connections) are left out. An announcement is only pulled while
its round is at most ``read_back_rounds`` (1) behind, so with 2 s rounds a batch whose
announcement takes more than ~2-4 s to store and read (a saturated machine) is never pulled: the
last line of the report says where each undelivered batch stopped.

Floor (from the protocol's timers, ``swarmnode.gossip.core``): an own item is announced
``announce_delay`` after ``publish``; each peer reads announcements every ``read_interval`` at a
phase that is uniform relative to the announcement; then one DHT read, one pull and admission
follow. So a peer's latency is at least ``announce_delay + U * read_interval`` (U uniform in
[0, 1)): quantile q is ``announce_delay + q * read_interval``; the last of N-1 peers follows the
maximum of N-1 uniforms: ``announce_delay + q ** (1 / (N - 1)) * read_interval``. The table shows
that timer floor, and the floor plus the medians of the measured operations on the path (DHT
store, DHT read, pull, admission): the round-trip floor on this machine.

Cost: per node, CPU seconds over wall seconds across the publishing rounds (the steady state), for
the Python process (``resource.getrusage``, all its threads) and for its p2pd child
(``/proc/<pid>/stat`` utime + stime), and resident memory at the end (``/proc/<pid>/status``
VmRSS). Machine-wide busy cores over the same window come from ``/proc/stat``, so work outside
the benchmark shows.

    python bench/gossip.py                          # 8 nodes, 30 rounds of 2 s
    python bench/gossip.py --nodes 4 --seconds 40   # shorter
    python bench/gossip.py --json out.json          # and the same figures as JSON

Every process runs in its own session, is stopped with SIGTERM then SIGKILL of its process group,
and gets SIGTERM from the kernel if the benchmark process dies (``PR_SET_PDEATHSIG``; nodes also
watch their parent); p2pd dies with its node (``swarmnode.net.child_guard``). Timing on a shared
2-core machine is fragile: run it alone, and read the machine-load line of the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, print_table, write_json

from swarmnode.admit import (
    Accepted,
    AdmissionConfig,
    AdmissionPipeline,
    AdmittedGroup,
    Rejected,
    Verdict,
    task_families,
)
from swarmnode.config import load_config
from swarmnode.core.rounds import round_at, round_start
from swarmnode.gossip.core import GossipConfig, GossipCore
from swarmnode.gossip.driver import GossipDriver, announcement_key
from swarmnode.gossip.intake import ExternalPool, envelope_digest
from swarmnode.identity import NodeIdentity
from swarmnode.net.config import NetConfig, default_identity_path
from swarmnode.net.errors import NetError, PeerCallError
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.net.records import DhtRecord
from swarmnode.ops.metrics import Metrics
from swarmnode.roles.convert import rollout_batch
from swarmnode.tasks import Task, TaskMixture, default_mixture, score_completion
from swarmnode.testing import HarnessError, Proc, WaitTimedOut, kill_p2pd_of, spawn, wait_until
from swarmnode.train import ScoredGroup
from swarmnode.wire import RolloutBatch, encode_envelope, seal, to_ms

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
SWARM = "bench-gossip"
EOS = 2  # the byte-level stand-in tokenizer's end token
POLL = 0.05
START_TIMEOUT = 150.0  # 2 shared cores, every process imports torch (via hivemind) at once
STOP_TIMEOUT = 20.0
GO_MARGIN = 3.0  # seconds between "all ready" and the first publishing round (batches are built)


# ------------------------------------------------------------------------------------ measuring


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from /proc (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` memory field in KiB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values[:8]) - idle) / tick, sum(values[:8]) / tick


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile; ``inf`` entries (never delivered) sort last."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if math.isinf(ordered[hi]):
        return math.inf
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class TimedAdmission(AdmissionPipeline):
    """The node's admission pipeline, unchanged, plus when each batch was accepted and what it cost."""

    def __init__(self, config: AdmissionConfig, *, now: float) -> None:
        super().__init__(config, now=now)
        self.accepted_at: dict[tuple[str, int], float] = {}  # (signer, swarm round) -> wall time
        self.seconds: list[float] = []
        self.cpu_seconds = 0.0  # not `cpu`: the pipeline's per-party CPU buckets are named so
        self.rejections: Counter[str] = Counter()

    def admit(self, data: bytes, now: float, **options: Any) -> Verdict:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        verdict = super().admit(data, now, **options)  # via, solicited, ...: whatever the driver passes
        done = time.time()
        self.cpu_seconds += time.process_time() - cpu0
        self.seconds.append(time.perf_counter() - wall0)
        if isinstance(verdict, Accepted) and verdict.groups:
            # Each node publishes one batch per swarm round: (signer, round) names it.
            self.accepted_at.setdefault((verdict.sender, verdict.groups[0].group.round), done)
        elif isinstance(verdict, Rejected):
            self.rejections[verdict.reason.value] += 1
        return verdict


class TimedRuntime(HivemindRuntime):
    """The node's runtime, unchanged, plus a record of the calls gossip makes: how long each took,
    how each announcement store ended, when each announcement was first read, what was pulled."""

    def __init__(self) -> None:
        super().__init__()
        self.durations: dict[str, list[float]] = {"dht_store": [], "dht_get": [], "pull": []}
        self.stores: list[tuple[str, str]] = []  # (key, "stored" | "refused" | error)
        self.first_seen: dict[tuple[str, str], float] = {}  # (key, owner) -> wall time
        self.pulls: list[tuple[str, str, str, float]] = []  # (peer, digests hex, outcome, seconds)

    async def dht_store(
        self,
        key: str,
        subkey: bytes,
        value: bytes,
        expiration_time: float,
        *,
        timeout: float,
        await_all_replicas: bool = True,
    ) -> bool:
        t0 = time.perf_counter()
        try:
            stored = await super().dht_store(
                key, subkey, value, expiration_time, timeout=timeout, await_all_replicas=await_all_replicas
            )
        except (NetError, OSError, ValueError) as exc:
            self.stores.append((key, f"{type(exc).__name__}: {exc}"[:160]))
            raise
        self.durations["dht_store"].append(time.perf_counter() - t0)
        self.stores.append((key, "stored" if stored else "refused"))
        return stored

    async def dht_get(self, key: str, *, timeout: float, latest: bool = True) -> list[DhtRecord]:
        t0 = time.perf_counter()
        records = await super().dht_get(key, timeout=timeout, latest=latest)
        self.durations["dht_get"].append(time.perf_counter() - t0)
        now = time.time()
        for record in records:
            self.first_seen.setdefault((key, record.owner), now)
        return records

    async def call_stream(
        self, peer_id: str, name: str, request: bytes, *, timeout: float, max_response_bytes: int = 64 << 20
    ) -> bytes:
        t0 = time.perf_counter()
        try:
            response = await super().call_stream(
                peer_id, name, request, timeout=timeout, max_response_bytes=max_response_bytes
            )
        except PeerCallError as exc:
            outcome = f"{exc.reason.value}: {exc.detail}"[:160]
            self.pulls.append((peer_id, request.hex(), outcome, time.perf_counter() - t0))
            raise
        self.durations["pull"].append(time.perf_counter() - t0)
        self.pulls.append((peer_id, request.hex(), "ok", time.perf_counter() - t0))
        return response


# ------------------------------------------------------------------------------------ the node side


def gossip_config(round_seconds: float, read_interval: float | None) -> GossipConfig:
    """What ``SwarmNode._run_jobs`` configures (``read_interval`` overridable for a sweep)."""
    if read_interval is None:
        read_interval = max(0.5, min(5.0, round_seconds / 4))
    return GossipConfig(round_seconds=round_seconds, read_interval=read_interval)


def wrong_answer(answer: str, j: int) -> str:
    try:
        return str(int(answer) + j + 1)
    except ValueError:
        return f"{answer} {j}"


def own_groups(mixture: TaskMixture, round_index: int, prompts: int, group_size: int) -> list[ScoredGroup]:
    """One round's groups as a generator would leave them: real tasks, texts scored by the verifier."""
    groups = []
    for gi, task in enumerate(mixture.sample(round_index, prompts)):
        answer = str(task.entry["answer"])
        texts = [answer if (gi + j) % 3 == 0 else wrong_answer(answer, j) for j in range(group_size)]
        ids = [[*text.encode(), EOS] for text in texts]
        groups.append(
            ScoredGroup(
                task=task,
                prompt_ids=[*task.prompt.encode()],
                completion_ids=ids,
                behaviour_logprobs=[[-0.05 * (j + 1)] * len(row) for j, row in enumerate(ids)],
                texts=texts,
                rewards=[score_completion(task, text) for text in texts],
                policy_version=0,
            )
        )
    return groups


def as_scored(admitted: AdmittedGroup) -> ScoredGroup:
    """``node.to_scored`` without a model: re-tokenized byte by byte instead of by the policy."""
    completions = admitted.group.completions
    task: Task = admitted.task
    return ScoredGroup(
        task=task,
        prompt_ids=[*task.prompt.encode()],
        completion_ids=[[*c.text.encode(), EOS] for c in completions],
        behaviour_logprobs=[],
        texts=[c.text for c in completions],
        rewards=list(admitted.rewards),
        policy_version=admitted.group.policy_version,
        source=admitted.sender,
        source_mean_logprobs=[c.mean_logprob for c in completions],
        source_reward_mean=admitted.group.batch_reward_mean,
    )


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)


async def sleep_until(at: float, stop: asyncio.Event) -> bool:
    """Sleep until wall time ``at``; False if ``stop`` was set first."""
    delay = at - time.time()
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
    return not stop.is_set()


async def watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Stop when the benchmark process is gone (it was killed before it could stop us)."""
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    stop.set()


async def wait_for_go(go_file: Path, stop: asyncio.Event, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if go_file.exists():
            plan: dict[str, Any] = json.loads(go_file.read_text())
            return plan
        await asyncio.sleep(POLL)
    return None


async def run_worker(args: argparse.Namespace) -> int:
    workdir: Path = args.dir
    index: int = args.worker
    log = logging.getLogger(f"bench.gossip.node{index}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.create_task(watch_parent(args.parent, stop))

    identity = NodeIdentity.generate()
    mixture = default_mixture(seed=index)  # tasks.seed = -1 -> node.seed = index (the main job's rule)
    home = workdir / f"node{index}"
    runtime = TimedRuntime()
    await runtime.start(
        NetConfig(
            identity_path=default_identity_path(home),
            host_maddrs=(LOOPBACK,),
            initial_peers=(args.bootstrap,),
        )
    )
    exchange: asyncio.Task[None] | None = None
    try:
        config = gossip_config(args.round_seconds, args.read_interval)
        admission = TimedAdmission(
            AdmissionConfig(
                allowed_tasks=task_families(mixture), max_policy_lag=8, local_peer_id=identity.peer_id
            ),
            now=time.time(),
        )
        core = GossipCore(config, runtime.peer_id, digest_of=envelope_digest)
        driver = GossipDriver(core, runtime, admission, ExternalPool(), as_scored, Metrics(), swarm=SWARM)
        await driver.start()
        exchange = asyncio.create_task(driver.run(), name="exchange")
        write_atomic(
            home / "ready.json",
            {"pid": os.getpid(), "p2pd_pid": runtime.p2pd_pid, "peer_id": identity.peer_id},
        )
        plan = await wait_for_go(workdir / "go.json", stop, START_TIMEOUT * 2)
        if plan is None:
            log.error("no go signal")
            return 1
        first, rounds, rs = int(plan["first_round"]), int(plan["rounds"]), args.round_seconds
        batches: list[RolloutBatch] = [
            rollout_batch(own_groups(mixture, r, args.prompts, args.group_size), "bench-gossip", 0, r)
            for r in range(first, first + rounds)
        ]
        jitter = random.Random(f"bench-gossip/{index}")
        spread = min(config.read_interval, rs / 2)
        published: list[dict[str, Any]] = []
        window: dict[str, float] = {}
        # Before the first round: the exchange runs (reads, DHT upkeep) but nothing is published.
        idle = {
            "wall": time.time(),
            "cpu": own_cpu_seconds(),
            "p2pd_cpu": cpu_seconds(runtime.p2pd_pid or -1),
        }
        if await sleep_until(round_start(first, rs), stop):
            idle = {
                "wall": time.time() - idle["wall"],
                "cpu": own_cpu_seconds() - idle["cpu"],
                "p2pd_cpu": cpu_seconds(runtime.p2pd_pid or -1) - idle["p2pd_cpu"],
            }
            window = {
                "wall": time.time(),
                "cpu": own_cpu_seconds(),
                "p2pd_cpu": cpu_seconds(runtime.p2pd_pid or -1),
                "admission_cpu": admission.cpu_seconds,
            }
        for k, batch in enumerate(batches):
            if not await sleep_until(round_start(first + k, rs) + jitter.uniform(0, spread), stop):
                break
            data = encode_envelope(seal(identity, batch, to_ms(time.time())))
            at = time.time()
            digest = driver.publish(data)
            published.append({"round": first + k, "at": at, "bytes": len(data), "digest": digest.hex()})
            log.debug("published round %d (%d bytes)", first + k, len(data))
        if window and await sleep_until(round_start(first + rounds, rs), stop):
            window = {
                "wall": time.time() - window["wall"],
                "cpu": own_cpu_seconds() - window["cpu"],
                "p2pd_cpu": cpu_seconds(runtime.p2pd_pid or -1) - window["p2pd_cpu"],
                "admission_cpu": admission.cpu_seconds - window["admission_cpu"],
                "rss_kib": rss_kib(os.getpid()),
                "rss_peak_kib": rss_kib(os.getpid(), "VmHWM"),
                "p2pd_rss_kib": rss_kib(runtime.p2pd_pid or -1),
            }
        else:
            window = {}
        # Keep serving (others may still pull from us) until the benchmark says stop.
        expected = (args.nodes - 1) * rounds
        done_written = False
        while not stop.is_set():
            arrived = sum(first <= r < first + rounds for (_, r) in admission.accepted_at)
            if arrived >= expected and not done_written:
                (home / "done").touch()
                done_written = True
            await sleep_until(time.time() + 0.1, stop)
        write_atomic(
            home / "result.json",
            {
                "index": index,
                "peer_id": identity.peer_id,
                "published": published,
                "accepted": [
                    {"sender": s, "round": r, "at": at} for (s, r), at in admission.accepted_at.items()
                ],
                "window": window,
                "idle": idle,
                "durations": {**runtime.durations, "admission": admission.seconds},
                "rejections": dict(admission.rejections),
                "libp2p_peer_id": runtime.peer_id,
                "stores": runtime.stores,
                "first_seen": [[key, owner, at] for (key, owner), at in runtime.first_seen.items()],
                "pulls": runtime.pulls,
                "gossip": core.stats.as_dict(),
                "crashed": exchange.done() and not exchange.cancelled() and exchange.exception() is not None,
            },
        )
        return 0
    finally:
        if exchange is not None:
            exchange.cancel()
            await asyncio.wait([exchange])
        watchdog.cancel()
        await runtime.stop()


# ------------------------------------------------------------------------------------ the benchmark side


def start(name: str, argv: list[str], home: Path) -> Proc:
    """A bootstrap or node process of the benchmark (the package's harness), its log in ``home``."""
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return spawn(name, argv, home / "log.txt", env=env, cwd=REPO, ready_file=home / "ready.json")


def stop(proc: Proc) -> None:
    """SIGTERM (a clean stop), SIGKILL of the group after a grace period; then its p2pd if left.

    p2pd has a group of its own and dies with its node: only one that outlived it is killed."""
    proc.stop(STOP_TIMEOUT, sig=signal.SIGTERM)
    kill_p2pd_of(default_identity_path(proc.log.parent))


def all_ready(procs: list[Proc]) -> list[dict[str, Any]] | None:
    infos = [p.ready() for p in procs]
    return [info for info in infos if info is not None] if all(infos) else None


def latencies(results: list[dict[str, Any]], first_measured: int) -> tuple[list[float], list[float], int]:
    """(per-peer latencies, until-every-peer latencies, publications measured); inf = never admitted."""
    accepted: list[dict[tuple[str, int], float]] = [
        {(a["sender"], a["round"]): a["at"] for a in res["accepted"]} for res in results
    ]
    per_peer: list[float] = []
    every: list[float] = []
    publications = 0
    for i, res in enumerate(results):
        for pub in res["published"]:
            if pub["round"] < first_measured:
                continue
            publications += 1
            key = (res["peer_id"], pub["round"])
            lat = [accepted[j].get(key, math.inf) - pub["at"] for j in range(len(results)) if j != i]
            per_peer += lat
            every.append(max(lat))
    return per_peer, every, publications


def undelivered_causes(results: list[dict[str, Any]], first_measured: int) -> Counter[str]:
    """For each measured publication some peer never admitted: where along the path it stopped."""
    causes: Counter[str] = Counter()
    accepted = [{(a["sender"], a["round"]) for a in res["accepted"]} for res in results]
    seen = [{(key, owner) for key, owner, _ in res["first_seen"]} for res in results]
    for i, pub_res in enumerate(results):
        stored = {key for key, outcome in pub_res["stores"] if outcome == "stored"}
        for pub in pub_res["published"]:
            key = announcement_key(SWARM, pub["round"])
            for j, res in enumerate(results):
                if (
                    j == i
                    or pub["round"] < first_measured
                    or (pub_res["peer_id"], pub["round"]) in accepted[j]
                ):
                    continue
                pulls = [why for _, digests, why, _ in res["pulls"] if pub["digest"] in digests]
                if key not in stored:
                    causes["announcement not stored"] += 1
                elif (key, pub_res["libp2p_peer_id"]) not in seen[j]:
                    causes["announcement never read"] += 1
                elif not pulls:
                    causes["read, never pulled"] += 1
                elif "ok" not in pulls:
                    causes[f"pulled {len(pulls)}x, every pull failed"] += 1
                else:
                    causes["pulled, not admitted"] += 1
    return causes


def summarize(values: list[float]) -> dict[str, float]:
    return {"p50": quantile(values, 0.5), "p95": quantile(values, 0.95), "max": quantile(values, 1.0)}


def fmt_s(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    parser.add_argument("--nodes", type=int, default=8, help="node processes (plus one bootstrap)")
    parser.add_argument("--rounds", type=int, default=30, help="publishing rounds (one batch per node each)")
    parser.add_argument("--seconds", type=float, help="publishing time instead of --rounds")
    parser.add_argument("--round-seconds", type=float, default=2.0, help="swarm round length")
    parser.add_argument("--read-interval", type=float, help="default: the node's rule, round/4 in [0.5, 5]")
    parser.add_argument("--warmup-rounds", type=int, default=2, help="first rounds left out of the figures")
    parser.add_argument("--prompts", type=int, help="groups per batch (default: rollout.prompts_per_round)")
    parser.add_argument("--group-size", type=int, help="completions per group (default: rollout.group_size)")
    parser.add_argument("--drain-seconds", type=float, default=10.0, help="wait for late admissions")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, results)")
    # Internal: this script is also the node process.
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prompts is None or args.group_size is None:
        defaults = load_config(None, environ={}).rollout  # the node's defaults
        args.prompts = args.prompts or defaults.prompts_per_round
        args.group_size = args.group_size or defaults.group_size
    if args.seconds is not None:
        args.rounds = max(1, round(args.seconds / args.round_seconds))
    if args.worker is not None:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return asyncio.run(run_worker(args))
    if args.nodes < 2 or args.rounds <= args.warmup_rounds:
        parser.error("need --nodes >= 2 and more --rounds than --warmup-rounds")
    try:
        return run_benchmark(args)
    except (RuntimeError, HarnessError) as exc:  # a process did not start or stopped early: log tail inside
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_benchmark's cleanup


def run_benchmark(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    workdir = Path(tempfile.mkdtemp(prefix="swarmnode-bench-gossip-"))
    config = gossip_config(args.round_seconds, args.read_interval)
    load_before = os.getloadavg()
    procs: list[Proc] = []
    t_start = time.monotonic()
    try:
        boot_args = ["-m", "swarmnode.roles.bootstrap", "--home", str(workdir / "boot"), "--listen", LOOPBACK]
        boot = start(
            "bootstrap", [*boot_args, "--ready-file", str(workdir / "boot" / "ready.json")], workdir / "boot"
        )
        procs.append(boot)
        boot_info = wait_until(boot.ready, START_TIMEOUT, "the bootstrap peer", procs=[boot], interval=POLL)
        maddr = next(m for m in boot_info["maddrs"] if "/127.0.0.1/" in m)
        nodes = []
        for i in range(args.nodes):
            argv = [__file__, "--worker", str(i), "--dir", str(workdir), "--bootstrap", maddr]
            argv += ["--parent", str(os.getpid()), "--nodes", str(args.nodes), "--rounds", str(args.rounds)]
            argv += ["--round-seconds", str(args.round_seconds), "--read-interval", str(config.read_interval)]
            argv += ["--prompts", str(args.prompts), "--group-size", str(args.group_size)]
            nodes.append(start(f"node{i}", argv, workdir / f"node{i}"))
        procs += nodes
        infos = wait_until(lambda: all_ready(nodes), START_TIMEOUT, "every node", procs=nodes, interval=POLL)
        startup_s = time.monotonic() - t_start
        rs = args.round_seconds
        first = round_at(time.time() + GO_MARGIN, rs) + 1
        write_atomic(workdir / "go.json", {"first_round": first, "rounds": args.rounds})

        # The machine and the bootstrap over the same window as the nodes' own figures.
        window_start, window_end = round_start(first, rs), round_start(first + args.rounds, rs)
        time.sleep(max(0.0, window_start - time.time()))
        busy0, total0 = machine_busy_seconds()
        boot_cpu0 = cpu_seconds(boot_info["pid"]) + cpu_seconds(boot_info["p2pd_pid"])
        time.sleep(max(0.0, window_end - time.time()))
        busy1, total1 = machine_busy_seconds()
        boot_cpu = cpu_seconds(boot_info["pid"]) + cpu_seconds(boot_info["p2pd_pid"]) - boot_cpu0
        window_s = time.time() - window_start

        # Late admissions until every node is done or the drain time is over (then they count as never).
        with contextlib.suppress(WaitTimedOut):
            wait_until(
                lambda: all((workdir / f"node{i}" / "done").exists() for i in range(args.nodes)),
                max(0.0, window_end + args.drain_seconds - time.time()),
                "every node to finish",
                procs=nodes,
                interval=POLL,
            )
        for p in nodes:  # all at once: none keeps pulling from a peer that is already gone
            p.kill_group(signal.SIGTERM)
        for p in nodes:
            stop(p)
        results = []
        for i, p in enumerate(nodes):
            path = workdir / f"node{i}" / "result.json"
            if not path.exists():
                raise RuntimeError(f"{p.name} left no result (exit {p.popen.returncode}):\n{p.tail()}")
            results.append(json.loads(path.read_text()))
        report(
            args,
            config,
            results,
            infos,
            startup_s,
            first,
            window_s,
            (busy1 - busy0, total1 - total0),
            boot_cpu,
            load_before,
        )
        return 0
    finally:
        for p in reversed(procs):
            stop(p)
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def report(
    args: argparse.Namespace,
    config: GossipConfig,
    results: list[dict[str, Any]],
    infos: list[dict[str, Any]],
    startup_s: float,
    first: int,
    window_s: float,
    machine_cpu: tuple[float, float],
    boot_cpu: float,
    load_before: tuple[float, float, float],
) -> None:
    n = args.nodes
    first_measured = first + args.warmup_rounds
    per_peer, every, publications = latencies(results, first_measured)
    a, ri = config.announce_delay, config.read_interval

    def pooled(name: str) -> float:
        values = [d for res in results for d in res["durations"][name]]
        return quantile(values, 0.5)

    ops = {name: pooled(name) for name in ("dht_store", "dht_get", "pull", "admission")}
    path_s = sum(ops.values())
    floors = {
        "per_peer": {"p50": a + 0.5 * ri, "p95": a + 0.95 * ri},
        "every_peer": {"p50": a + 0.5 ** (1 / (n - 1)) * ri, "p95": a + 0.95 ** (1 / (n - 1)) * ri},
    }
    figures = {"per_peer": summarize(per_peer), "every_peer": summarize(every)}
    rows = []
    for key, label in (("per_peer", "one peer admitted"), ("every_peer", "every peer admitted")):
        for q in ("p50", "p95"):
            got, timer = figures[key][q], floors[key][q]
            rows.append(
                [
                    label,
                    q,
                    fmt_s(got),
                    f"{timer:.3f}",
                    f"{timer + path_s:.3f}",
                    f"{got / (timer + path_s):.2f}",
                ]
            )
    per_node = []
    for res, info in zip(results, infos, strict=True):
        w, idle = res["window"], res["idle"]
        per_node.append(
            {
                "node": res["index"],
                "python_cpu_frac": w["cpu"] / w["wall"],
                "p2pd_cpu_frac": w["p2pd_cpu"] / w["wall"],
                "admission_cpu_frac": w["admission_cpu"] / w["wall"],
                "rss_mib": w["rss_kib"] / 1024,
                "rss_peak_mib": w["rss_peak_kib"] / 1024,
                "p2pd_rss_mib": w["p2pd_rss_kib"] / 1024,
                "total_cpu_frac": (w["cpu"] + w["p2pd_cpu"]) / w["wall"],
                "idle_total_cpu_frac": (idle["cpu"] + idle["p2pd_cpu"]) / idle["wall"],
                "idle_seconds": idle["wall"],
                "pid": info["pid"],
            }
        )

    def spread(name: str, fmt: str) -> str:
        values = [row[name] for row in per_node]
        return f"{sum(values) / len(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    cpu_rows = [
        ["python process CPU (cores)", spread("python_cpu_frac", ".3f")],
        ["  of which admission", spread("admission_cpu_frac", ".3f")],
        ["p2pd CPU (cores)", spread("p2pd_cpu_frac", ".3f")],
        ["python + p2pd CPU (cores)", spread("total_cpu_frac", ".3f")],
        ["  same, before the first round (reads only)", spread("idle_total_cpu_frac", ".3f")],
        ["python RSS at end (MiB)", spread("rss_mib", ".0f")],
        ["python peak RSS (MiB)", spread("rss_peak_mib", ".0f")],
        ["p2pd RSS at end (MiB)", spread("p2pd_rss_mib", ".0f")],
    ]
    delivered = sum(not math.isinf(x) for x in per_peer)
    rejections: Counter[str] = Counter()
    gossip: Counter[str] = Counter()
    pull_failures: Counter[str] = Counter()
    failure_seconds: list[float] = []
    stores: Counter[str] = Counter()
    for res in results:
        rejections.update(res["rejections"])
        failed = [(why, sec) for _, _, why, sec in res["pulls"] if why != "ok"]
        pull_failures.update(why for why, _ in failed)
        failure_seconds += [sec for _, sec in failed]
        stores.update(outcome for _, outcome in res["stores"])
        gossip.update(res["gossip"])
    losses = undelivered_causes(results, first_measured)
    crashed = [res["index"] for res in results if res["crashed"]]
    busy, total = machine_cpu
    cores = os.cpu_count() or 1
    busy_cores = busy / total * cores
    bench_cpu = sum(r["window"]["cpu"] + r["window"]["p2pd_cpu"] for r in results) + boot_cpu
    batch_bytes = [p["bytes"] for res in results for p in res["published"]]
    mean_kib = sum(batch_bytes) / len(batch_bytes) / 1024
    mach = machine()
    print(
        f"gossip benchmark: {n} nodes + 1 bootstrap on 127.0.0.1, {mach['cores']} cores ({mach['cpu']}), "
        f"python {mach['python']}; load average before start {load_before[0]:.2f}"
    )
    print(
        f"settings: round {args.round_seconds:g} s, read interval {ri:g} s, announce delay {a:g} s, "
        f"{args.rounds} rounds ({args.warmup_rounds} warm-up left out), one batch per node per round = "
        f"{args.prompts} groups x {args.group_size} completions "
        f"(~{mean_kib:.1f} KiB signed); start-up of all processes {startup_s:.1f} s"
    )
    print()
    print_table(
        f"publication -> admission, seconds ({publications} publications x {n - 1} peers; "
        f"delivered {delivered}/{len(per_peer)})",
        ["latency", "q", "measured", "timer floor", "floor + path", "measured/floor+path"],
        rows,
        [
            f"timer floor: announce_delay + q * read_interval (one peer), "
            f"announce_delay + q^(1/{n - 1}) * read_interval (last of {n - 1} peers)",
            "path (medians, pooled over nodes): "
            + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in ops.items())
            + f" = {path_s * 1000:.1f} ms",
        ],
    )
    print()
    print_table(
        f"exchange cost per node over {window_s:.1f} s of publishing: mean (min-max) of {n} nodes",
        ["figure", "value"],
        cpu_rows,
        [
            "CPU: resource.getrusage (python process, all threads) and /proc/<pid>/stat (its p2pd), "
            "CPU seconds / wall seconds; RSS: /proc/<pid>/status VmRSS / VmHWM",
            f"bootstrap (python + p2pd) CPU {boot_cpu / window_s:.3f} cores; machine busy "
            f"{busy_cores:.2f} of {cores} cores, of which this benchmark {bench_cpu / window_s:.2f} "
            f"and other work {max(0.0, busy_cores - bench_cpu / window_s):.2f}",
            f"admission rejections: {dict(rejections) or 'none'}; exchange crashes: {crashed or 'none'}; "
            f"pulls started {gossip['pulls_started']}, failed {gossip['pulls_failed']}, "
            f"timed out {gossip['pulls_timed_out']}; reads {gossip['reads']}",
            *(f"  pull failure x{count}: {why}" for why, count in pull_failures.most_common(5)),
            *(
                [f"  pull failures came after {', '.join(f'{x:.2f}' for x in sorted(failure_seconds))} s"]
                if failure_seconds
                else []
            ),
            f"announcement stores: {dict(stores)}",
            f"never admitted ({sum(losses.values())}), by where it stopped: {dict(losses) or 'none'}",
        ],
    )
    write_json(
        args.json,
        {
            "benchmark": "gossip",
            "machine": mach,
            "load_average_before": load_before,
            "settings": {
                "nodes": n,
                "rounds": args.rounds,
                "warmup_rounds": args.warmup_rounds,
                "round_seconds": args.round_seconds,
                "read_interval": ri,
                "announce_delay": a,
                "prompts": args.prompts,
                "group_size": args.group_size,
                "batch_bytes_mean": sum(batch_bytes) / len(batch_bytes),
            },
            "startup_s": startup_s,
            "publications": publications,
            "deliveries": {"delivered": delivered, "expected": len(per_peer)},
            "latency_s": {
                k: {q: (None if math.isinf(v) else v) for q, v in d.items()} for k, d in figures.items()
            },
            "timer_floor_s": floors,
            "path_medians_s": ops,
            "per_node": per_node,
            "bootstrap_cpu_frac": boot_cpu / window_s,
            "machine_busy_cores": busy_cores,
            "benchmark_cpu_cores": bench_cpu / window_s,
            "window_s": window_s,
            "rejections": dict(rejections),
            "pull_failures": dict(pull_failures),
            "announcement_stores": dict(stores),
            "undelivered_causes": dict(losses),
            "pull_failure_seconds": sorted(failure_seconds),
            "gossip_stats_total": dict(gossip),
            "crashed_nodes": crashed,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
