"""The projects SWE tasks are made from: the manifest, and each project's sdist downloaded once,
checked against its pinned sha256 and unpacked into a git repository (its pristine tree is the
first commit; every task's bug is a commit on top of it).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
import urllib.request
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from urllib.parse import urljoin

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .repos import GIT_IDENTITY, git

INDEX = os.environ.get("GYMLOOP_PYPI_SIMPLE", "https://pypi.org/simple/")


class Project(BaseModel):
    """One real project of the manifest."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The PyPI name; also the repository's directory name.")
    kind: str = Field(description="What sort of project it is (for people).")
    version: str = Field(description="The pinned version.")
    sdist: str = Field(description="The sdist's file name on the index.")
    sha256: str = Field(description="The sdist's sha256: a download that differs is refused.")
    python_path: list[str] = Field(default_factory=lambda: [""], description="sys.path entries, relative to the repository.")
    modules: dict[str, list[str]] = Field(description="Source module -> the test files that judge it.")
    heldout: bool = Field(False, description="The whole project is in the held-out split.")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    heldout_fraction: float = Field(0.2, ge=0, le=1, description="Share of functions held out in train projects.")
    projects: list[Project]


def load_manifest(path: str | Path | None = None) -> Manifest:
    text = Path(path).read_text() if path else resources.files("gymloop.swe").joinpath("manifest.yaml").read_text()
    return Manifest.model_validate(yaml.safe_load(text))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def download_sdist(project: Project, cache: Path) -> Path:
    """The project's sdist in the cache: downloaded from the index once, its sha256 checked."""
    target = cache / "sdists" / project.sdist
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == project.sha256:
        return target
    page_url = urljoin(INDEX, re.sub(r"[-_.]+", "-", project.name).lower() + "/")
    with urllib.request.urlopen(page_url, timeout=60) as r:
        parser = _Links()
        parser.feed(r.read().decode())
    url = next((urljoin(page_url, h) for h in parser.links if h.split("#")[0].endswith("/" + project.sdist)), None)
    if url is None:
        raise FileNotFoundError(f"{project.sdist} is not on {page_url}")
    with urllib.request.urlopen(url.split("#")[0], timeout=120) as r:
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != project.sha256:
        raise ValueError(f"{project.sdist}: sha256 {digest} is not the manifest's {project.sha256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def unpack(project: Project, sdist: Path, repos: Path) -> tuple[Path, str]:
    """The project's git repository under `repos` (made once from the sdist) and its pristine commit."""
    repo = repos / project.name
    if (repo / ".git").exists():
        return repo, git(repo, "rev-list", "--max-parents=0", "HEAD").decode().split()[0]
    tmp = repos / f".{project.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(sdist.read_bytes())) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts[1:]          # drop the sdist's top folder
            if not parts or not (m.isfile() or m.isdir()) or ".." in parts:
                continue
            dest = tmp.joinpath(*parts)
            if m.isdir():
                dest.mkdir(parents=True, exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tar.extractfile(m).read())
    git(tmp, "init", "-q")
    git(tmp, "add", "-A", "-f")
    git(tmp, "commit", "-q", "-m", f"{project.name} {project.version} from {project.sdist}", env=GIT_IDENTITY)
    tmp.rename(repo)
    return repo, git(repo, "rev-parse", "HEAD").decode().strip()
