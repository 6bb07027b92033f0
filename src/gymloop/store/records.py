"""What the repositories return: one typed record per table (JSON columns decoded), so a caller
reads named fields of a known shape instead of walking a dict by guesswork."""
from __future__ import annotations

from typing import Any, TypedDict


class Trace(TypedDict):
    id: str
    created: float
    model: str
    model_version: int
    request: dict[str, Any]          # the chat request as received
    response: dict[str, Any]         # the answer as sent
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    key_id: str | None


class Feedback(TypedDict):
    id: int
    trace_id: str
    created: float
    reward: float | None
    label: str | None
    env: str | None
    env_version: int | None
    task_id: str | None


class GradedTrace(TypedDict):
    """A trace with its latest rewarded verdict."""
    id: str
    model_version: int          # the served model version that answered
    request: dict[str, Any]
    response: dict[str, Any]
    reward: float
    env: str | None
    env_version: int | None
    task_id: str | None


class Session(TypedDict, total=False):
    id: str
    created: float
    key_id: str | None
    task: dict                 # what the program named as the session's task (or its first user input)
    reward: float              # the latest verdict (failed / succeeded only)


class FeedbackTask(TypedDict):
    env: str
    env_version: int | None
    task_id: str
    last: float


class ModelVersion(TypedDict):
    version: int
    parent: int | None
    path: str
    created: float
    status: str                      # candidate | promoted | rejected | rolled_back
    scores: dict[str, float]         # suite -> pass@1 at the gate
    promoted_at: float | None        # when it was (last) promoted; None: never


class Round(TypedDict):
    run_id: str
    round: int
    status: str
    started: float
    finished: float | None
    metrics: dict[str, Any]          # target, before/after, why, curriculum, drift, training, economics, version


class DriftEvent(TypedDict):
    id: int
    created: float
    run_id: str | None
    round: int | None
    env: str
    kind: str                        # eval | production
    before: float
    after: float
    detail: str


class LedgerRecord(TypedDict):
    id: int
    run_id: str | None
    round: int | None
    phase: str
    seconds: float
    device_seconds: float
    prompt_tokens: int
    generated_tokens: int
    trained_tokens: int
    served_tokens: int
    flops: float
    dollars: float
    created: float


class FileRecord(TypedDict):
    id: str
    seq: int
    tenant: str
    created: float
    filename: str
    purpose: str
    bytes: int
    status: str
    status_details: str | None
    kind: str | None
    examples: int | None


class Job(TypedDict):
    seq: int
    id: str
    tenant: str
    created: float
    status: str
    model: str
    training_file: str
    validation_file: str | None
    suffix: str | None
    seed: int
    metadata: dict[str, str]
    method: dict[str, Any]
    hyperparameters: dict[str, Any]
    fine_tuned_model: str | None
    final_path: str | None
    started: float | None
    worker: str | None
    heartbeat: float | None
    finished_at: float | None
    trained_tokens: int | None
    error: dict[str, Any] | None
    result_files: list[str]
    progress: dict[str, Any]


class JobEvent(TypedDict):
    seq: int
    id: str
    job_id: str
    created: float
    level: str
    message: str
    type: str
    data: dict[str, Any]


class Checkpoint(TypedDict):
    seq: int
    id: str
    job_id: str
    created: float
    step: int
    path: str
    model_id: str
    metrics: dict[str, Any]


class Replica(TypedDict):
    """A serving replica's latest heartbeat (a fleet's replicas write one every few seconds)."""
    id: str
    fleet: str
    host: str
    pid: int
    started: float
    seen: float                      # when it last wrote this row
    version: int                     # the model version it answers with
    version_since: float             # when it started answering with it
    in_flight: int                   # HTTP requests it was answering
    answered: int                    # requests it answered since it started
