"""A task in SWE-bench's instance format, read and written as JSON lines.

The fields are SWE-bench's (`swebench.types.SWEbenchInstance`): `instance_id`, `repo`,
`base_commit`, `problem_statement`, `patch` (the gold fix, a unified diff), `test_patch`,
`FAIL_TO_PASS`, `PASS_TO_PASS` (pytest node ids; SWE-bench's own files hold them as
JSON-encoded strings, which are accepted too), `version`, plus what gymloop adds: `test_cmd`
(extra pytest arguments a project needs), `python_path` (directories put on sys.path, e.g.
`src`), `test_files` (paths the verification restores from `base_commit`; by default every file
the F2P/P2P ids name), `split`, `difficulty` and `created_by`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class Difficulty(BaseModel):
    """How hard a generated task looks from outside."""

    model_config = ConfigDict(extra="forbid")
    lines_changed: int = Field(description="Lines the gold patch removes plus adds.")
    files: int = Field(description="Files the gold patch touches.")
    fail_to_pass: int = Field(description="Tests that fail with the bug.")
    frames_to_bug: int | None = Field(None, description="Stack frames between the first failing test and "
                                      "the buggy line in its traceback; 0: the test's own assertion caught a "
                                      "wrong value (the bug is not on the stack).")


class Instance(BaseModel):
    """One SWE-bench task instance."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    instance_id: str = Field(description="Unique id, e.g. 'isodate__0.7.2-17'.")
    repo: str = Field(description="A git directory under the repositories root, or an absolute path.")
    base_commit: str = Field(description="The commit the agent starts from (the bug is in it).")
    problem_statement: str = Field(description="What a user would report: the failing test and its error.")
    patch: str = Field("", description="The gold fix as a unified diff (not shown to the agent).")
    test_patch: str = Field("", description="A diff applied to the test files before the tests run "
                            "(SWE-bench's new tests; empty when base_commit's tests already catch the bug).")
    FAIL_TO_PASS: list[str] = Field(description="Tests that fail at base_commit and must pass after the fix.")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="Tests that pass and must keep passing.")
    version: str = Field("", description="The project's version.")
    environment_setup_commit: str = Field("", description="SWE-bench's field; the sandbox's interpreter is fixed here.")
    created_at: str = Field("", description="When the instance was made.")
    hints_text: str = Field("", description="SWE-bench's field; never shown to the agent by gymloop.")
    test_cmd: list[str] = Field(default_factory=list, description="Extra pytest arguments the project needs.")
    python_path: list[str] = Field(default_factory=lambda: ["", "src"],
                                   description="Directories (relative to the repository) put on sys.path.")
    test_files: list[str] = Field(default_factory=list, description="Files restored from base_commit before "
                                  "the tests run; default: the files the test ids name, and every conftest.py.")
    split: Literal["train", "heldout"] = Field("train", description="gymloop's train / held-out split.")
    difficulty: Difficulty | None = Field(None, description="Generated tasks' difficulty fields.")
    created_by: str = Field("user", description="'gymloop swe build' for generated tasks.")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "test_cmd", "python_path", "test_files", mode="before")
    @classmethod
    def _json_list(cls, v):
        """SWE-bench's files hold these lists as JSON-encoded strings."""
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected a list or a JSON-encoded list, got {v[:80]!r}") from exc
        return v

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _some_failing(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("FAIL_TO_PASS is empty: a task needs at least one test that fails before the fix")
        return v

    def tests(self) -> list[str]:
        return list(self.FAIL_TO_PASS) + [t for t in self.PASS_TO_PASS if t not in self.FAIL_TO_PASS]

    def restored_files(self) -> set[str]:
        """The files verification takes from base_commit (+ test_patch) whatever the patch did."""
        named = {t.split("::", 1)[0] for t in self.tests()}
        return set(self.test_files) | named

    def swebench_dict(self) -> dict:
        """The instance as SWE-bench's own files write it (lists as JSON strings), with gymloop's fields."""
        d = self.model_dump(mode="json")
        d["FAIL_TO_PASS"], d["PASS_TO_PASS"] = json.dumps(self.FAIL_TO_PASS), json.dumps(self.PASS_TO_PASS)
        return d


def load_instances(path: str | Path) -> list[Instance]:
    """Every instance of a JSON-lines file; a bad line is an error naming its line number."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Instance.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            raise ValueError(f"{path}:{n}: {where}: {first['msg']}") from None
    ids = [i.instance_id for i in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate instance_id {next(i for i in ids if ids.count(i) > 1)!r}")
    return out


def dump_instances(instances: Iterable[Instance], fmt: Literal["swebench", "gymloop"] = "swebench") -> str:
    rows = [i.swebench_dict() if fmt == "swebench" else i.model_dump(mode="json") for i in instances]
    return "".join(json.dumps(r) + "\n" for r in rows)
