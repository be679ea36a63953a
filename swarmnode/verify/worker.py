"""A verifier worker process: scores batches of completions under the limits of ``limits``.

Started by ``VerifierPool`` as ``python -m swarmnode.verify.worker PARENT_PID SETTINGS_JSON``.
Talks over its inherited stdin/stdout, one frame each way per batch; a frame is a
4-byte big-endian length and a JSON object (never pickle: the parent must be able
to read a compromised worker's bytes safely). Before reading any request it moves
those pipes off fds 0 and 1 (so a scorer's ``print`` cannot forge a frame), warms
the configured families (imports, generators, scorers) and locks itself down.

Request: ``{"groups": [[dataset, config, seed, index, prompt_format, prompt, entry, [text, ...]],
...]}``, ``entry`` the task's entry as JSON text (or null: the worker regenerates it).
Answer: ``{"rewards": [[float, ...], ...], "cpu_s": float}`` or
``{"failed": "verifier_failed" | "task_invalid", "detail": str, "cpu_s": float}``.
A completion past its CPU limit ends the process (exit 75); the batch's CPU budget
is the kernel's ``RLIMIT_CPU``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

from swarmnode.verify import limits as lim

MAX_REQUEST_BYTES = 16 << 20


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    """``size`` bytes from a pipe (a read returns what has arrived: loop), or None at its end."""
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_frame(stream: BinaryIO) -> Any:
    header = _read_exactly(stream, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_REQUEST_BYTES:
        return None
    body = _read_exactly(stream, size)
    return None if body is None else json.loads(body)


def _write_frame(stream: BinaryIO, message: dict[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def _private_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Our request/answer pipes on private fds; fds 0-2 become /dev/null."""
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return requests, answers


def _warm(families: list[str]) -> None:
    """Import and exercise each family's generator and scorer once, before the lock-down."""
    from swarmnode.tasks import TaskId, check_family, regenerate
    from swarmnode.tasks.scoring import score_completion

    for spec in families:
        dataset, config, prompt_format = json.loads(spec)
        check_family(dataset)  # the audit reads upstream's source: here, while it can
        task = regenerate(TaskId(dataset, config, 0, 0, prompt_format))
        score_completion(task, str(task.entry.get("answer", "")))
        score_completion(task, "not an answer")


def _trust_upstream(families: list[str]) -> None:
    """Score these families with upstream's own (audit-flagged) scorer: only for tests of the boundary
    itself, which must hold even where the audit or a safe scorer has missed something."""
    from swarmnode.tasks.safe_scorers import SAFE_SCORERS
    from swarmnode.tasks.scoring import upstream_scorer

    for name in families:
        SAFE_SCORERS[name] = upstream_scorer(name)


def _score(request: dict[str, Any], limits: lim.VerifierLimits) -> dict[str, Any]:
    from swarmnode.errors import TaskError
    from swarmnode.tasks import Task, TaskId, regenerate
    from swarmnode.tasks.scoring import score_completion

    started = lim.cpu_seconds()
    tasks = []
    for dataset, config, seed, index, prompt_format, prompt, entry, texts in request["groups"]:
        task_id = TaskId(dataset, config, int(seed), int(index), prompt_format)
        if entry is not None:  # the parent regenerated it already (its own code, not a peer's bytes)
            tasks.append((Task(task_id, str(prompt), json.loads(entry)), texts))
            continue
        try:
            tasks.append((regenerate(task_id), texts))
        except TaskError as exc:
            return {"failed": "task_invalid", "detail": str(exc)[:200], "cpu_s": lim.cpu_seconds() - started}
    lim.budget_batch(limits)
    rewards = []
    for task, texts in tasks:
        row = []
        for text in texts:
            lim.start_completion_timer(limits)
            try:
                row.append(score_completion(task, str(text)))
            except BaseException as exc:  # noqa: BLE001 - the boundary: SystemExit, RecursionError, ...
                lim.stop_completion_timer()
                return {
                    "failed": "verifier_failed",
                    "detail": f"{task.id.dataset} scorer raised {type(exc).__name__}",
                    "cpu_s": lim.cpu_seconds() - started,
                }
            lim.stop_completion_timer()
        rewards.append(row)
    return {"rewards": rewards, "cpu_s": lim.cpu_seconds() - started}


def main(argv: list[str]) -> int:
    parent_pid, settings = int(argv[1]), json.loads(argv[2])
    lim.die_with_parent(parent_pid)
    sys.dont_write_bytecode = True
    requests, answers = _private_pipes()
    limits = lim.VerifierLimits(**settings["limits"])
    netns = lim.enter_network_namespace() if settings.get("isolate_network", True) else False
    _trust_upstream(settings.get("unsafe_upstream", []))
    import reasoning_gym  # noqa: F401 - every generator module, before the jail hides the files

    lim.lock_down(limits)
    lim.budget_batch(lim.VerifierLimits(batch_cpu_s=limits.start_timeout_s))
    _warm(settings.get("families", []))  # under the limits: a family's config may be a stranger's
    jailed = lim.jail(settings.get("root"))
    _write_frame(answers, {"ready": True, "network_namespace": netns, "jailed": jailed})
    while True:
        try:
            request = _read_frame(requests)
        except ValueError:
            return 2
        if request is None:
            return 0
        _write_frame(answers, _score(request, limits))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
