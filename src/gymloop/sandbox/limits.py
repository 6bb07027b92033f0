"""What a sandboxed run may use (Limits) and what it did (Result)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Resource limits of one sandboxed run. The sandbox's limits live here and nowhere else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(10.0, gt=0, description="Wall-clock limit; the whole process tree is killed.")
    cpu_s: int | None = Field(None, ge=1, description="CPU seconds (RLIMIT_CPU); default: ceil(timeout_s) + 1.")
    memory_mb: int = Field(512, ge=16, description="Address space per process (RLIMIT_AS), MiB.")
    max_processes: int = Field(64, ge=1, description="Processes and threads of the slot's uid (RLIMIT_NPROC).")
    max_file_mb: int = Field(16, ge=1, description="Largest file a process may write (RLIMIT_FSIZE), MiB.")
    max_open_files: int = Field(256, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(1 << 20, ge=1024, description="Kept bytes of stdout and of stderr each; the rest is discarded.")
    tmpfs_mb: int = Field(64, ge=1, description="Size of each private tmpfs (/tmp and the scratch dir /work), MiB.")
    cpus: int | None = Field(None, ge=1, description="Pin the run to this many cores (None: no pinning).")

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2


@dataclass
class Result:
    """Outcome of one run.

    `error` is set only when the sandbox itself failed (could not start, namespace creation
    refused): an infrastructure error, never the program's fault.
    """

    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    oom: bool
    wall_s: float
    cpu_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The program ran and exited 0 within its limits."""
        return self.error is None and self.exit_code == 0 and not self.timed_out

    def as_dict(self) -> dict:
        return asdict(self)
