"""The names lm-evaluation-harness knows (its tasks, groups and tags) and the hub data set each task loads, read
from the task YAMLs of the installed lm-eval package (and a directory of the user's own) without importing it:
lm-eval's own index parses some 14,000 files and takes most of a minute, this reads them in a few seconds. The
plan checks task names with it; `fetch --dry-run` prints what each task loads."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

# Top-level `task: name`, `group: name`, `tag: name`; a tag may also be a list of names.
# Keys may be quoted ("task": "wmdp_bio"), as many generated task files write them, and indented (JSON, which is
# YAML, or a group's inline task definitions).
NAME = re.compile(r"^[ \t]*['\"]?(task|group|tag)['\"]?:[ \t]*['\"]?([^\s'\"#,\[\]{}]+)", re.MULTILINE)
TAG_LIST = re.compile(r"^['\"]?(?:tag|task)['\"]?:[ \t]*\n((?:[ \t]*-[ \t]*\S+[ \t]*\n)+)", re.MULTILINE)
FIELD = re.compile(
    r"^['\"]?(dataset_path|dataset_name|include)['\"]?:[ \t]*['\"]?([^'\"#\n]+?)['\"]?[ \t]*$", re.MULTILINE
)


def package_tasks() -> Path | None:
    """lm-eval's task directory, or None where lm-eval is not installed."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "tasks"


RANK = {"task": 0, "group": 1, "tag": 2, "member": 3}


@functools.lru_cache(maxsize=8)
def _scan(directory: Path) -> dict[str, Path]:
    """name -> the file that declares it: the file whose `task:` it is before one whose group or tag it is."""
    found: dict[str, tuple[int, Path]] = {}

    def add(name: str, kind: str, path: Path) -> None:
        if name not in found or RANK[kind] < found[name][0]:
            found[name] = (RANK[kind], path)

    for path in sorted(directory.rglob("*.yaml")) + sorted(directory.rglob("*.yml")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for kind, name in NAME.findall(text):
            add(name, kind, path)
        for block in TAG_LIST.findall(text):
            for item in re.findall(r"-[ \t]*(\S+)", block):
                add(item.strip("'\""), "member", path)
    return {name: path for name, (_, path) in found.items()}


def known(include_path: str | None = None) -> dict[str, Path] | None:
    """Every name -> the YAML that declares it (the user's directory first), or None without lm-eval."""
    tasks = package_tasks()
    if tasks is None:
        return None
    names = dict(_scan(tasks))
    if include_path and Path(include_path).is_dir():
        names.update(_scan(Path(include_path)))
    return names


def local_tasks(include_path: str | None) -> set[str]:
    """The names the YAML files under a directory of the user's own tasks declare (evaluation.include_path)."""
    if not include_path or not Path(include_path).is_dir():
        return set()
    return set(_scan(Path(include_path).resolve()))


def dataset_of(path: Path, depth: int = 3) -> str:
    """`dataset_path (dataset_name)` of the task YAML at `path`, following its `include:` as lm-eval does."""
    try:
        fields = dict(FIELD.findall(path.read_text(errors="replace")))
    except OSError:
        return ""
    if "dataset_path" not in fields and "include" in fields and depth:
        return dataset_of(path.parent / fields["include"].strip(), depth - 1)
    source = fields.get("dataset_path", "").strip()
    name = fields.get("dataset_name", "").strip()
    name = "" if name in ("null", "None", "~") else name
    return source + (f" ({name})" if source and name else "")
