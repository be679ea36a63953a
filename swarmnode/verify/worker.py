"""A verifier worker process: scores batches of completions under the limits of ``limits``.

Started by ``VerifierPool`` as ``python -m swarmnode.verify.worker PARENT_PID SETTINGS_JSON``.
Talks over its inherited stdin/stdout, one frame each way per batch (an envelope's
groups); a frame is a 4-byte big-endian length and a body. Before reading any request
it moves those pipes off fds 0 and 1 (so a scorer's ``print`` cannot forge a frame),
warms the configured families (imports, generators, scorers) and locks itself down.

Request (parent to worker): a ``marshal`` body, a tuple of groups, each
``(dataset, entry, (text, ...))`` with the task's entry as the parent regenerated it, or
``(dataset, None, (text, ...), (config, seed, index, prompt_format))`` where the entry
would not survive marshal exactly (the worker regenerates the task). Marshal
because it keeps tuples, sets and every number exactly as the parent's generator
made them, at a third of JSON's cost. Only the parent writes these bytes (its own
values, with peer text only as length-prefixed strings), and marshal builds plain
values, never runs code; the parent never reads marshal (or pickle) from a worker.

Answer (worker to parent): ``b"r"`` and one little-endian float64 per completion, in
request order (the parent knows the shape and checks every value), or a JSON object:
``{"ready": true, ...}`` once at start, ``{"failed": "verifier_failed" | "task_invalid",
"detail": str}``. Packed floats because writing and reading 128 rewards as JSON text
cost ~75 us per envelope, more than scoring them.

A completion past its CPU limit ends the process (exit 75); the batch's CPU budget
is the kernel's ``RLIMIT_CPU``.
"""

from __future__ import annotations

import json
import marshal
import os
import signal
import struct
import sys
from typing import Any

from swarmnode.verify import limits as lim

MAX_REQUEST_BYTES = 16 << 20
REWARDS = b"r"  # first byte of an answer that carries rewards (a JSON answer starts with "{")
_READ_CHUNK = 1 << 16


class _Requests:
    """Frames from the parent's pipe: one ``read`` per frame when it fits in a chunk."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    def _fill(self, size: int) -> bool:
        while len(self.buffer) < size:
            chunk = os.read(self.fd, max(_READ_CHUNK, size - len(self.buffer)))
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def next(self) -> bytes | None:
        """The next frame's body, or None at the pipe's end or on a frame over the cap."""
        if not self._fill(4):
            return None
        (size,) = struct.unpack_from(">I", self.buffer)
        if size > MAX_REQUEST_BYTES or not self._fill(4 + size):
            return None
        body = bytes(self.buffer[4 : 4 + size])
        del self.buffer[: 4 + size]
        return body


def _write_frame(fd: int, body: bytes) -> None:
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def _json(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _private_pipes() -> tuple[int, int]:
    """Our request/answer pipes on private fds; fds 0-2 become /dev/null."""
    requests, answers = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return requests, answers


def _warm(families: list[str]) -> None:
    """Import and exercise each family's generator and scorer once, before the lock-down."""
    from swarmnode.errors import TaskError
    from swarmnode.tasks import TaskId, UnsafeScorerError, check_family, regenerate
    from swarmnode.tasks.scoring import score_completion

    for spec in families:
        dataset, config, prompt_format = json.loads(spec)
        try:
            check_family(dataset)  # the audit reads upstream's source: here, while it can
            task = regenerate(TaskId(dataset, config, 0, 0, prompt_format))
        except (UnsafeScorerError, TaskError):
            # Admission refuses this family's tasks before they reach a worker (task_not_allowed,
            # task_invalid); a request for one anyway fails here as verifier_failed. One such family
            # in a checked file must not keep the worker from judging the rest.
            continue
        score_completion(task, str(task.entry.get("answer", "")))
        score_completion(task, "not an answer")


def _trust_upstream(families: list[str]) -> None:
    """Score these families with upstream's own (audit-flagged) scorer: only for tests of the boundary
    itself, which must hold even where the audit or a safe scorer has missed something."""
    from swarmnode.tasks.safe_scorers import SAFE_SCORERS
    from swarmnode.tasks.scoring import upstream_scorer

    for name in families:
        SAFE_SCORERS[name] = upstream_scorer(name)


def _score(body: bytes, limits: lim.VerifierLimits) -> bytes:
    """One batch: the answer frame's body for the request ``body``."""
    from swarmnode.errors import TaskError
    from swarmnode.tasks import TaskId, regenerate
    from swarmnode.tasks.scoring import extract_answer, reward_of, scorer_for

    jobs: list[tuple[str, dict[str, Any], Any]] = []
    for row in marshal.loads(body):
        dataset, entry, texts = row[0], row[1], row[2]
        if entry is None:  # the parent could not send its entry exactly: regenerate the task here
            try:
                entry = regenerate(TaskId(dataset, *row[3])).entry
            except TaskError as exc:
                return _json({"failed": "task_invalid", "detail": str(exc)[:200]})
        jobs.append((dataset, entry, texts))
    lim.budget_batch(limits)
    rewards: list[float] = []
    add = rewards.append
    arm, prof, per_completion = signal.setitimer, signal.ITIMER_PROF, limits.completion_cpu_s  # bound once
    dataset = ""
    try:
        for dataset, entry, texts in jobs:
            scorer = scorer_for(dataset)  # cached after the warm-up
            for text in texts:
                # Re-armed per completion, never stopped in between: each completion gets its full
                # limit from its own start (the loop's few instructions count with the one before),
                # at one timer call per completion instead of two.
                arm(prof, per_completion)  # lim.start_completion_timer, inlined
                add(reward_of(scorer, extract_answer(text), entry))
    except BaseException as exc:  # noqa: BLE001 - the boundary: SystemExit, RecursionError, ...
        lim.stop_completion_timer()
        return _json({"failed": "verifier_failed", "detail": f"{dataset} scorer raised {type(exc).__name__}"})
    lim.stop_completion_timer()
    return REWARDS + struct.pack(f"<{len(rewards)}d", *rewards)


def main(argv: list[str]) -> int:
    parent_pid, settings = int(argv[1]), json.loads(argv[2])
    lim.die_with_parent(parent_pid)
    sys.dont_write_bytecode = True
    request_fd, answer_fd = _private_pipes()
    limits = lim.VerifierLimits(**settings["limits"])
    netns = lim.enter_network_namespace() if settings.get("isolate_network", True) else False
    _trust_upstream(settings.get("unsafe_upstream", []))
    import reasoning_gym  # noqa: F401 - every generator module, before the jail hides the files

    lim.lock_down(limits)
    lim.budget_batch(lim.VerifierLimits(batch_cpu_s=limits.start_timeout_s))
    _warm(settings.get("families", []))  # under the limits: a family's config may be a stranger's
    jailed = lim.jail(settings.get("root"))
    _write_frame(answer_fd, _json({"ready": True, "network_namespace": netns, "jailed": jailed}))
    requests = _Requests(request_fd)
    while True:
        body = requests.next()
        if body is None:
            return 0
        try:
            answer = _score(body, limits)
        except (ValueError, EOFError, TypeError, IndexError):  # not a request the parent writes: stop
            return 2
        _write_frame(answer_fd, answer)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
