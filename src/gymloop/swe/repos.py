"""Repositories as files: a commit's tree read into memory, a variant committed without a checkout,
and unified diffs made and applied in memory (`git apply` on the touched files only).

A tree is a dict path -> bytes. Episodes and verifications copy nothing else: the sandbox gets
the tree's bytes, and an episode's edits are an overlay on the shared, read-only base tree.
"""
from __future__ import annotations

import difflib
import functools
import os
import subprocess
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

Tree = Mapping[str, bytes]


# commits gymloop makes are reproducible: the same identity and date every time, so a rebuilt task
# gets the same base_commit
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "gymloop", "GIT_AUTHOR_EMAIL": "gymloop@localhost", "GIT_COMMITTER_NAME": "gymloop",
                "GIT_COMMITTER_EMAIL": "gymloop@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
                "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


class GitError(RuntimeError):
    """A git command failed (the repository or commit is not what the task says)."""


def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> bytes:
    r = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                       env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})})
    if r.returncode:
        raise GitError(f"git {' '.join(args[:2])} in {repo}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def resolve_repo(repo: str, repos_root: Path | None) -> Path:
    """An instance's `repo`: an absolute path, or a directory under `repos_root`."""
    p = Path(repo)
    if not p.is_absolute():
        if repos_root is None:
            raise ValueError(f"repo {repo!r} is relative: give the repositories' root (options.repos / --repos)")
        p = repos_root / repo
    if not (p / ".git").exists() and not (p / "HEAD").exists():
        raise ValueError(f"repo {repo!r}: {p} is not a git repository")
    return p


@functools.lru_cache(maxsize=64)
def read_tree(repo: Path, commit: str) -> Tree:
    """Every regular file of `commit` (symlinks and submodules left out), read in one `cat-file
    --batch`; read-only and cached (episodes and verifications of one commit share it)."""
    listing = git(repo, "ls-tree", "-r", "-z", commit).split(b"\0")
    entries = []
    for item in filter(None, listing):
        meta, path = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode in (b"100644", b"100755"):
            entries.append((path.decode(), sha.decode()))
    out = git(repo, "cat-file", "--batch", input="".join(f"{sha}\n" for _, sha in entries).encode())
    tree, pos = {}, 0
    for path, _sha in entries:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        tree[path] = out[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return MappingProxyType(tree)


def commit_variant(repo: Path, parent: str, changes: Mapping[str, bytes], message: str) -> str:
    """A commit whose tree is `parent`'s with `changes` (path -> new bytes), made without touching
    the work tree or the index (a temporary index)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), **GIT_IDENTITY}
        git(repo, "read-tree", parent, env=env)
        for path, data in changes.items():
            sha = git(repo, "hash-object", "-w", "--stdin", input=data).decode().strip()
            git(repo, "update-index", "--add", "--cacheinfo", f"100644,{sha},{path}", env=env)
        tree = git(repo, "write-tree", env=env).decode().strip()
        return git(repo, "commit-tree", tree, "-p", parent, "-m", message, env=env).decode().strip()


def unified_diff(before: Tree, after: Tree) -> str:
    """A git-style unified diff from `before` to `after` (text files; new and deleted files too)."""
    parts = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        a_lines = a.decode(errors="replace").splitlines(keepends=True) if a is not None else []
        b_lines = b.decode(errors="replace").splitlines(keepends=True) if b is not None else []
        head = [f"diff --git a/{path} b/{path}\n"]
        if a is None:
            head.append("new file mode 100644\n")
        elif b is None:
            head.append("deleted file mode 100644\n")
        body = list(difflib.unified_diff(a_lines, b_lines, "/dev/null" if a is None else f"a/{path}",
                                         "/dev/null" if b is None else f"b/{path}", n=3))
        body = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in body]
        parts.append("".join(head + body))
    return "".join(parts)


def patch_paths(patch: str) -> list[str]:
    """The paths a unified diff touches (both sides of a rename), from its headers."""
    paths: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            a, _, b = line[len("diff --git "):].partition(" b/")
            for p in (a.removeprefix("a/"), b):
                if p and p not in paths:
                    paths.append(p)
        elif line.startswith(("--- ", "+++ ")):
            p = line[4:].split("\t")[0].strip()
            if p != "/dev/null":
                p = p[2:] if p[:2] in ("a/", "b/") else p
                if p not in paths:
                    paths.append(p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            p = line.split(" ", 2)[2]
            if p not in paths:
                paths.append(p)
    return paths


class PatchError(ValueError):
    """A patch that does not apply (the model's fault: scored 0, never an infrastructure error)."""


def apply_patch(tree: Tree, patch: str) -> dict[str, bytes]:
    """`tree` with `patch` applied by `git apply` in a scratch directory holding only the files the
    patch touches. Returns the whole new tree (unchanged files shared, not copied)."""
    if not patch.strip():
        return dict(tree)
    touched = patch_paths(patch)
    for p in touched:
        if Path(p).is_absolute() or ".." in Path(p).parts:
            raise PatchError(f"patch path {p!r} leaves the repository")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for p in touched:
            if p in tree:
                (root / p).parent.mkdir(parents=True, exist_ok=True)
                (root / p).write_bytes(tree[p])
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "--unsafe-paths", "-"], cwd=root,
                           input=patch.encode(), capture_output=True,
                           # never a repository around the scratch dir: git apply then patches plain files
                           env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CEILING_DIRECTORIES": str(root.parent)})
        if r.returncode:
            raise PatchError("patch does not apply: " + r.stderr.decode(errors="replace").strip()[:500])
        out = dict(tree)
        for p in touched:
            f = root / p
            if f.is_file():
                out[p] = f.read_bytes()
            else:
                out.pop(p, None)
        return out
