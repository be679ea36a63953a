"""A pool of verifier worker processes: one blocking ``score`` call per batch, safe from any thread.

Owns: starting workers with a clean environment and only their two pipes,
handing each batch to an idle worker, the wall-clock deadline, reading answers
with a size cap and checking their shape, killing and replacing a worker that
timed out, died or failed, and the counters ``/metrics`` shows. Must not: block
forever (every wait has a deadline) or believe a worker's CPU figure (the
kernel's is used).

A replacement starts in the background; a batch waits for the next idle worker
up to ``start_timeout_s``. What a replacement costs (its start-up CPU, ~2 s of
importing reasoning-gym) is added to the failure's ``cpu_s``, so whoever made a
worker die pays for its replacement in its CPU budget.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import swarmnode
from swarmnode.config import VerifyConfig
from swarmnode.tasks import Task
from swarmnode.verify.limits import EXIT_COMPLETION_TIMEOUT, VerifierLimits
from swarmnode.verify.outcome import Scored, ScoreOutcome, VerifierFailure, VerifierReason
from swarmnode.verify.worker import REWARDS

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 << 20
_TICKS = os.sysconf("SC_CLK_TCK")
_READ_CHUNK = 1 << 16
#: Plain values a worker gets exactly as the parent's generator made them (``marshal``'s own types).
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
_MAX_ENTRY_DEPTH = 32


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) the kernel has charged to ``pid`` so far; 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


def _marshal_exact(value: Any, depth: int = 0) -> bool:
    """Whether ``marshal`` carries ``value`` across unchanged: plain values and the exact built-in
    containers only. Subclasses (an IntEnum, a defaultdict) and bytes-like objects (a numpy array,
    which marshal would turn into ``bytes``) are not: the worker regenerates such a task instead.
    Written out (no ``all(...)``): it runs on every group admitted, ~2 us for a chain_sum entry."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= _MAX_ENTRY_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) not in _SCALARS and not _marshal_exact(key, depth + 1):
                return False
            if type(item) not in _SCALARS and not _marshal_exact(item, depth + 1):
                return False
        return True
    if kind in _SEQUENCES:
        for item in value:
            if type(item) not in _SCALARS and not _marshal_exact(item, depth + 1):
                return False
        return True
    return False


def _row(task: Task, texts: Sequence[str], plain: bool) -> tuple[Any, ...]:
    t = task.id
    ids: tuple[Any, ...] = (t.dataset, t.config, t.seed, t.index, t.prompt_format)
    if plain:  # a str or int subclass somewhere (never from the wire): marshal takes only the plain ones
        ids = (str(t.dataset), str(t.config), int(t.seed), int(t.index), str(t.prompt_format))
        texts = tuple(map(str, texts))
    if _marshal_exact(task.entry):
        return (ids[0], task.entry, texts)
    return (ids[0], None, texts, ids[1:])


def _request(groups: Sequence[tuple[Task, Sequence[str]]]) -> bytes:
    """The request frame's body (``worker`` describes it): each task's regenerated entry when marshal
    carries it exactly (the worker then need not regenerate it again: half the cost of a chain_sum
    group), else the id the worker regenerates it from."""
    try:
        return marshal.dumps(tuple([_row(task, texts, False) for task, texts in groups]))
    except ValueError:
        return marshal.dumps(tuple([_row(task, texts, True) for task, texts in groups]))


class _Worker:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.network_namespace = False
        self.jailed = False
        self.start_cpu_s = 0.0
        assert process.stdin is not None and process.stdout is not None
        self._request_fd = process.stdin.fileno()
        self._answer_fd = process.stdout.fileno()
        os.set_blocking(self._request_fd, False)  # every write is bounded by a deadline
        self._buffer = bytearray()
        try:
            # Kept open: one pread per reading (~2 us) instead of opening /proc/PID/stat (~40 us),
            # nanoseconds instead of clock ticks, and never a later process that reused the pid.
            self._schedstat: int | None = os.open(
                f"/proc/{process.pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC
            )
        except OSError:
            self._schedstat = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu(self) -> float:
        """CPU seconds (user + system) the kernel has charged to this worker so far."""
        if self._schedstat is None:
            return _proc_cpu(self.pid)
        try:
            return int(os.pread(self._schedstat, 64, 0).split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return _proc_cpu(self.pid)

    def send(self, body: bytes, deadline: float) -> bool:
        """Write one frame; False if the worker has not taken it all by ``deadline``."""
        view = memoryview(struct.pack(">I", len(body)) + body)
        while view:
            try:
                view = view[os.write(self._request_fd, view) :]  # a request fits the pipe: one write
                continue
            except BlockingIOError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([], [self._request_fd], [], remaining)
        return True

    def receive(self, deadline: float) -> bytes | str:
        """The next frame's body, or a string saying why there is none ("timeout", "closed", ...)."""
        size: int | None = None
        while True:
            if size is None and len(self._buffer) >= 4:
                (size,) = struct.unpack_from(">I", self._buffer)
                if size > MAX_ANSWER_BYTES:
                    return f"answer of {size} bytes"
            if size is not None and len(self._buffer) >= 4 + size:
                body = bytes(self._buffer[4 : 4 + size])
                del self._buffer[: 4 + size]
                return body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready, _, _ = select.select([self._answer_fd], [], [], remaining)
            if not ready:
                return "timeout"
            want = _READ_CHUNK if size is None else max(_READ_CHUNK, 4 + size - len(self._buffer))
            chunk = os.read(self._answer_fd, want)  # select said readable: returns what has arrived
            if not chunk:
                return "closed"
            self._buffer += chunk

    def kill(self) -> float:
        """Kill the worker and reap it; the CPU seconds it used in its life."""
        try:
            self.process.kill()
        except OSError:
            pass
        try:
            _, _, usage = os.wait4(self.process.pid, 0)
            self.process.returncode = -signal.SIGKILL
            cpu = usage.ru_utime + usage.ru_stime
        except ChildProcessError:
            cpu = 0.0
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None
        return cpu


def _json_answer(body: bytes) -> dict[str, Any] | str:
    try:
        message = json.loads(body)
    except ValueError:
        return "unreadable answer"
    return message if isinstance(message, dict) else "unreadable answer"


class VerifierPool:
    """``workers`` sandboxed verifier processes; ``score`` blocks the calling thread, never the loop."""

    def __init__(
        self,
        limits: VerifierLimits | None = None,
        *,
        workers: int = 2,
        families: Iterable[tuple[str, str, str]] = (),
        isolate_network: bool = True,
        unsafe_upstream: Iterable[str] = (),
    ) -> None:
        """``unsafe_upstream``: families to score with upstream's audit-flagged scorer anyway. Only
        for tests of the boundary itself (what if the audit missed one); never in a node."""
        if workers < 1:
            raise ValueError(f"a verifier pool needs at least 1 worker, got {workers}")
        self.limits = limits or VerifierLimits()
        self.size = workers
        self.families = sorted({json.dumps(list(f)) for f in families})
        self.isolate_network = isolate_network
        self.unsafe_upstream = sorted(unsafe_upstream)
        self.counters: Counter[str] = Counter()
        self.cpu_seconds = 0.0  # all scoring CPU, workers' start-up included
        self.network_namespace = False  # what the last worker to start could arrange, as it reported
        self.jailed = False
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._live: set[_Worker] = set()
        self._start_cpu_s = 2.0  # replaced by the measured start-up cost of the first workers
        self._spawn_requests: queue.Queue[bool | None] = queue.Queue()
        self._ready = threading.Condition()
        self._started = 0
        self._start_error: str | None = None
        self._supervisor: threading.Thread | None = None
        self._root: str | None = None

    @classmethod
    def from_config(cls, config: VerifyConfig, families: Iterable[tuple[str, str, str]]) -> VerifierPool:
        """A pool for a role's task families with its ``[verify]`` settings (not started)."""
        limits = VerifierLimits(
            completion_cpu_s=config.completion_cpu_s,
            batch_cpu_s=config.batch_cpu_s,
            memory_bytes=config.memory_mb << 20,
        )
        return cls(limits, workers=config.workers, families=families)

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self) -> _Worker:
        settings = {
            "limits": {
                "completion_cpu_s": self.limits.completion_cpu_s,
                "batch_cpu_s": self.limits.batch_cpu_s,
                "wall_slack_s": self.limits.wall_slack_s,
                "memory_bytes": self.limits.memory_bytes,
                "start_timeout_s": self.limits.start_timeout_s,
            },
            "families": self.families,
            "isolate_network": self.isolate_network,
            "unsafe_upstream": self.unsafe_upstream,
            "root": self._root,
        }
        env = {
            "PATH": os.defpath,
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(Path(swarmnode.__file__).resolve().parents[1]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "swarmnode.verify.worker", str(os.getpid()), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=env,
            cwd="/",
            start_new_session=True,
        )
        worker = _Worker(process)
        frame = worker.receive(time.monotonic() + self.limits.start_timeout_s)
        ready = _json_answer(frame) if isinstance(frame, bytes) else frame
        if not isinstance(ready, dict) or ready.get("ready") is not True:
            worker.kill()
            raise RuntimeError(f"verifier worker did not start: {ready!r}")
        worker.network_namespace = bool(ready.get("network_namespace"))
        worker.jailed = bool(ready.get("jailed"))
        worker.start_cpu_s = worker.cpu()
        return worker

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                return
            self._live.add(worker)
            self.network_namespace = worker.network_namespace
            self.jailed = worker.jailed
            self.cpu_seconds += worker.start_cpu_s
        self._idle.put(worker)

    def start(self) -> None:
        """Start every worker and wait until each is ready; raises ``RuntimeError`` if one cannot start.

        Workers are spawned by the pool's own thread, which lives until ``close``: the kernel's
        parent-death signal fires when the *thread* that forked a child exits."""
        self._root = tempfile.mkdtemp(prefix="swarmnode-verifier-")  # empty: the workers' chroot (root)
        self._supervisor = threading.Thread(target=self._supervise, name="verifier-pool", daemon=True)
        self._supervisor.start()
        for _ in range(self.size):
            self._spawn_requests.put(True)
        deadline = time.monotonic() + self.limits.start_timeout_s * self.size
        with self._ready:
            while self._started < self.size:
                if self._start_error is not None:
                    raise RuntimeError(self._start_error)
                if not self._ready.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise RuntimeError("verifier workers did not start in time")
        with self._lock:
            starts = [w.start_cpu_s for w in self._live if w.start_cpu_s > 0]
        if starts:
            self._start_cpu_s = sum(starts) / len(starts)

    def _supervise(self) -> None:
        while True:
            if self._spawn_requests.get() is None:
                return
            for attempt in range(3):
                if self._closed:
                    return
                try:
                    self._add(self._spawn())
                    break
                except (OSError, RuntimeError) as exc:
                    log.error("verifier worker start failed (attempt %d): %s", attempt + 1, exc)
                    if attempt == 2:
                        with self._ready:
                            self._start_error = f"verifier worker could not start: {exc}"
                            self._ready.notify_all()
                    time.sleep(0.5)
            with self._ready:
                self._started += 1
                self._ready.notify_all()

    def _replace_later(self) -> None:
        self.counters["restarts"] += 1
        self._spawn_requests.put(True)

    def _retire(self, worker: _Worker) -> float:
        with self._lock:
            self._live.discard(worker)
        cpu = worker.kill()
        self._replace_later()
        return cpu

    def close(self) -> None:
        with self._lock:
            self._closed = True
            live, self._live = list(self._live), set()
        self._spawn_requests.put(None)
        for worker in live:
            worker.kill()
        if self._supervisor is not None:
            self._supervisor.join(timeout=self.limits.start_timeout_s)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> VerifierPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring

    def score(self, groups: Sequence[tuple[Task, Sequence[str]]]) -> ScoreOutcome:
        """Score every completion of every group in one worker; a failure value on any trouble."""
        if not groups:
            return Scored(())
        try:
            worker = self._idle.get(timeout=self.limits.start_timeout_s)
        except queue.Empty:
            self.counters["failed"] += 1
            return VerifierFailure(VerifierReason.FAILED, "no verifier worker available")
        request = _request(groups)
        completions = sum(len(texts) for _, texts in groups)
        budget = min(self.limits.batch_cpu_s, completions * self.limits.completion_cpu_s)
        before = worker.cpu()
        started = time.monotonic()
        deadline = started + budget + self.limits.wall_slack_s
        try:
            answer = worker.receive(deadline) if worker.send(request, deadline) else "timeout"
        except OSError as exc:
            answer = f"pipe: {exc}"
        self.counters["batches"] += 1
        if isinstance(answer, bytes):
            outcome = self._judge(answer, groups, completions, worker.cpu() - before)
            if isinstance(outcome, Scored):
                self._idle.put(worker)
                self.cpu_seconds += outcome.cpu_s
                return outcome
        else:
            outcome = self._death(worker, answer)
        # Any failure retires the worker: whatever ran in it may have changed its state.
        life = self._retire(worker)
        # A worker held by a sleeping scorer costs wall time, not CPU: charge whichever is larger,
        # plus the replacement's start-up.
        cost = max(life - before, time.monotonic() - started, 0.0) + self._start_cpu_s
        self.cpu_seconds += cost
        return VerifierFailure(outcome.reason, outcome.detail, cost)

    def _death(self, worker: _Worker, why: str) -> VerifierFailure:
        try:
            code = worker.process.wait(timeout=1.0) if why == "closed" else worker.process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if why == "timeout" or code in (EXIT_COMPLETION_TIMEOUT, -signal.SIGXCPU, -signal.SIGKILL):
            self.counters["timeouts"] += 1
            return VerifierFailure(VerifierReason.TIMEOUT, "scoring ran past its time limit")
        self.counters["failed"] += 1
        return VerifierFailure(VerifierReason.FAILED, f"verifier worker died ({why}, exit {code})")

    def _judge(
        self, body: bytes, groups: Sequence[tuple[Task, Sequence[str]]], completions: int, cpu_s: float
    ) -> ScoreOutcome:
        if body[:1] != REWARDS:
            answer = _json_answer(body)
            self.counters["failed"] += 1
            if isinstance(answer, dict) and "failed" in answer:
                detail = str(answer.get("detail", ""))[:200]
                return VerifierFailure(VerifierReason.FAILED, detail or str(answer["failed"])[:50], cpu_s)
            return VerifierFailure(VerifierReason.FAILED, "verifier answer has the wrong shape", cpu_s)
        if len(body) != 1 + 8 * completions:
            self.counters["failed"] += 1
            return VerifierFailure(VerifierReason.FAILED, "verifier answer has the wrong shape", cpu_s)
        values = struct.unpack_from(f"<{completions}d", body, 1)
        # Any NaN makes the sum NaN (and fails ``total == total``); without one, min and max are exact.
        total = sum(values)
        if completions and not (total == total and min(values) >= 0.0 and max(values) <= 1.0):
            self.counters["failed"] += 1
            return VerifierFailure(VerifierReason.FAILED, "verifier reward outside [0, 1]", cpu_s)
        rewards = []
        at = 0
        for _, texts in groups:
            rewards.append(values[at : at + len(texts)])
            at += len(texts)
        return Scored(tuple(rewards), cpu_s)

    def isolation(self) -> dict[str, bool | str]:
        """What the workers could arrange on this machine (``/status``; the README's Reliability)."""
        note = ""
        if not (self.network_namespace and self.jailed):
            note = (
                "verifier workers keep the host's network and file system (not root): they cannot "
                "write into a file (RLIMIT_FSIZE = 0), but can open connections and create empty files"
            )
        return {"network_namespace": self.network_namespace, "file_system_jail": self.jailed, "note": note}

    def stats(self) -> dict[str, float]:
        """Counters for ``/metrics`` and ``/status``."""
        return {
            "workers": self.size,
            "batches": self.counters["batches"],
            "timeouts": self.counters["timeouts"],
            "failed": self.counters["failed"],
            "restarts": self.counters["restarts"],
            "cpu_seconds": round(self.cpu_seconds, 3),
        }


__all__ = ["VerifierPool"]
