"""The training stack declared in conf/stack.yaml against what this interpreter has.

    python -m recipes.stack                               # table: found versus declared
    python -m recipes.stack check --run-dir RUN           # what every rank checks first; exit 2 on a mismatch
    python -m recipes.stack check --run-dir RUN --versions-only   # the same versions, nothing imported, no GPU
    python -m recipes.stack install [--wheel-dir DIR]     # pip-install what is missing or out of range
    python -m recipes.stack wheels DIR                    # the wheels install needs, for air-gapped machines

A mismatch found after the queue wait and the allocation of a thousand GPUs should cost seconds, not an
AttributeError deep inside the trainer: every training rank runs the check before it imports megatron-core, and
data preparation before it starts. Imports only the standard library and yaml at module level; versions come from
the installed packages' metadata, so the table and data preparation's check import neither torch nor megatron-core
(seconds each): only a training rank's check imports the components, which it would import next anyway. A local
launch script checks the versions once before torchrun (`--versions-only`, a fraction of a second against an import
of the whole stack: 8 s on a CPU machine), so a mismatch is one line rather than one failure per rank; the ranks'
own check then finds what only an import or the GPU shows."""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
import importlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterable, Mapping, Sequence

from common.config import Config, Fp8Recipe, StackConfig, StackPackage
from common.plan import Plan
from common.typed import from_plain

REPO = Path(__file__).resolve().parent.parent
STACK_FILE = REPO / "conf" / "stack.yaml"
# The declared components, in the order they import (each needs the one before).
COMPONENTS = ("torch", "megatron_core", "transformer_engine")
FIX = (
    "build the training image (python main.py stages=[container], or the Dockerfile; docs/stack.md), "
    "install it here with `python -m recipes.stack install`, or set stack_check=false to accept the risk"
)


def load_declared(cfg: Config | None = None) -> StackConfig:
    """The `stack` section of a run's config, else conf/stack.yaml of this repository."""
    if cfg is not None:
        return cfg.stack
    import yaml

    with open(STACK_FILE) as f:
        return from_plain(StackConfig, yaml.safe_load(f)["stack"], path="stack")


def component_of(declared: StackConfig, name: str) -> StackPackage:
    """One of COMPONENTS by its key in the stack section."""
    components: dict[str, StackPackage] = {
        "torch": declared.torch,
        "megatron_core": declared.megatron_core,
        "transformer_engine": declared.transformer_engine,
    }
    return components[name]


# --------------------------------------------------------------------------- what is here
@dataclass(frozen=True)
class Found:
    version: str | None  # None: not importable
    error: str | None = None  # why it did not import (first line)


@dataclass(frozen=True)
class GpuFound:
    name: str | None  # None: no CUDA GPU visible
    capability: tuple[int, int] | None
    nccl: str | None  # NCCL version torch was built with; None: no NCCL


def _version_of(module_name: str, distribution: str) -> str | None:
    top = importlib.import_module(module_name.split(".")[0])
    version = getattr(top, "__version__", None)
    if version:
        return str(version)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_location(module_name: str) -> Path | None:
    """The directory an import of `module_name` would load its top-level package from, found without running
    any of it (a top-level name is located, not imported); None when it is not there."""
    top, *rest = module_name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except ValueError:  # in sys.modules without a spec: only importing tells
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    # A namespace package (megatron) spans directories: the submodule comes from the first one that has it.
    for location in spec.submodule_search_locations:
        path = Path(location, *rest)
        if path.is_dir() or path.with_suffix(".py").is_file():
            return Path(location).resolve()
    return None


def metadata_version(module_name: str, distribution: str) -> str | None:
    """The installed version of `distribution`, when an import of `module_name` would load that installation;
    None when it is not installed, or when the import would load another copy (a checkout on PYTHONPATH, an
    editable install): only importing tells that copy's version."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    # locate_file is typed as returning a SimplePath protocol, which Path() does not take; its str() is the path.
    installed = Path(str(dist.locate_file(module_name.split(".")[0]))).resolve()
    return dist.version if _import_location(module_name) == installed else None


def discover(component: StackPackage, imports: bool = False) -> Found:
    """The component's version: from its installed metadata when that is what an import would load (nothing is
    imported: torch and megatron-core take seconds), else by importing it. `imports=True` always imports: a package
    can be installed and still fail to import (a torch extension built for another torch, a missing CUDA library),
    which a training rank must find before it builds anything."""
    import warnings

    if not imports:
        version = metadata_version(component.module, component.distribution)
        if version is not None:
            return Found(version)
    try:
        # Quietly: megatron-core warns at import about optional packages (apex, and Transformer Engine where only
        # data preparation runs) that are not what this check is about.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(component.module)
    except Exception as err:  # any import failure is the finding, whatever its type
        text = str(err).strip().splitlines()
        return Found(None, f"{type(err).__name__}: {text[0] if text else ''}".strip(": "))
    return Found(_version_of(component.module, component.distribution) or "unknown")


def discover_all(declared: StackConfig, names: Iterable[str] = COMPONENTS, imports: bool = False) -> dict[str, Found]:
    found: dict[str, Found] = {}
    for name in names:
        if name != "torch" and found.get("torch", Found("-")).version is None:
            found[name] = Found(None, "needs torch")  # importing it would only repeat torch's error
            continue
        found[name] = discover(component_of(declared, name), imports)
    return found


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def discover_installed(declared: StackConfig) -> dict[str, Found]:
    """The components by their installed distributions, without importing them: an image build has no GPU, and
    Transformer Engine does not import without one."""
    return {
        name: Found(installed_version(component_of(declared, name).distribution), "not installed")
        for name in COMPONENTS
    }


def torch_build() -> dict[str, str | None] | None:
    """What the installed torch was built for ({"cuda": "13.0" or None, "hip": ...}), read from torch/version.py
    without importing torch; None when that file is not there or not as expected."""
    location = _import_location("torch.version")
    if location is None:
        return None
    try:
        tree = ast.parse((location / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    build: dict[str, str | None] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and target.id in ("cuda", "hip")
            and isinstance(value, ast.Constant)
            and (value.value is None or isinstance(value.value, str))  # a version string, or None when not built
        ):
            build[target.id] = value.value
    return build if set(build) == {"cuda", "hip"} else None


def discover_gpu(local_rank: int = 0) -> GpuFound:
    # A torch built for neither CUDA nor ROCm sees no GPU and has no NCCL: no need to import it (seconds) to know.
    build = torch_build()
    if build is not None and build["cuda"] is None and build["hip"] is None:
        return GpuFound(None, None, None)
    import torch

    nccl = None
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    if not torch.cuda.is_available():
        return GpuFound(None, None, nccl)
    index = local_rank if local_rank < torch.cuda.device_count() else 0
    return GpuFound(torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index)), nccl)


# --------------------------------------------------------------------------- comparing
def in_range(version: str, supported: str) -> bool:
    """PEP 440 range check; local labels (+cu130, +e75546b) and pre-releases of a supported version count."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(supported).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _capability(text: str) -> tuple[int, int]:
    major, minor = str(text).split(".")
    return int(major), int(minor)


def problems(
    declared: StackConfig,
    found: Mapping[str, Found],
    gpu: GpuFound | None = None,
    precision: str = "bf16",
    python: str | None = None,
) -> list[str]:
    """Each mismatch as a short phrase; empty when the stack is as declared. `gpu=None` skips the GPU and NCCL
    checks (data preparation needs neither)."""
    out = []
    python = python or ".".join(map(str, sys.version_info[:3]))
    if not in_range(python, declared.python.supported):
        out.append(f"Python {python} found, {declared.python.supported} needed")
    for name, what in found.items():
        component = component_of(declared, name)
        label = component.distribution
        if what.version is None:
            out.append(
                f"{label} not importable ({what.error}), {component.supported} needed (tested {component.tested})"
            )
        elif what.version == "unknown" or not in_range(what.version, component.supported):
            out.append(f"{label} {what.version} found, {component.supported} needed (tested {component.tested})")
    if gpu is not None:
        need = _capability(declared.min_compute_capability[precision])
        if gpu.capability is None:
            out.append("no CUDA GPU visible to this process")
        elif gpu.capability < need:
            have = ".".join(map(str, gpu.capability))
            out.append(
                f"{precision} needs compute capability {need[0]}.{need[1]} or newer, {gpu.name} has {have}"
                + ("; use dtype=bf16" if precision == "fp8" else "; use dtype=fp8" if precision != "bf16" else "")
            )
        if gpu.nccl is None:
            out.append("torch has no NCCL (torch.distributed.is_nccl_available() is false)")
    return out


def error_line(found_problems: Sequence[str]) -> str:
    return f"error: the training stack does not match conf/stack.yaml: {'; '.join(found_problems)}. Fix: {FIX}"


# --------------------------------------------------------------------------- the check every rank runs
def check_or_exit(
    cfg: Config | None,
    precision: str | None,
    rank: int = 0,
    local_rank: int = 0,
    components: Sequence[str] = COMPONENTS,
    say: Callable[[str], None] | None = None,
    versions_only: bool = False,
) -> None:
    """Exit with status 2 (one line, printed on rank 0 only) when the stack does not match the run's `stack`
    section (`cfg=None`: conf/stack.yaml). `precision=None`: no GPU needed (data preparation). `versions_only`:
    the versions from the installed metadata and no GPU, as data preparation's check, for a run's precision."""
    if cfg is not None and not cfg.stack_check:
        return
    declared = load_declared(cfg)
    # A training rank (precision given) imports the components next: importing them here costs nothing more and
    # finds one that is installed but broken. Data preparation and the check before the ranks need the versions.
    on_a_rank = precision is not None and not versions_only
    found = discover_all(declared, components, imports=on_a_rank)
    gpu = None
    if on_a_rank and found.get("torch", Found(None)).version is not None:
        gpu = discover_gpu(local_rank)
    issues = problems(declared, found, gpu, precision or "bf16")
    if issues:
        if rank == 0:
            (say or (lambda line: print(line, file=sys.stderr, flush=True)))(error_line(issues))
        sys.exit(2)


def check_run(run_dir: str, rank: int = 0, local_rank: int = 0, versions_only: bool = False) -> None:
    """The check for a training rank of RUN_DIR (its config.yaml and plan.json)."""
    from common.run import load_run_or_exit

    run = load_run_or_exit(run_dir)  # the first reader of the run directory on a rank: one line, before anything starts
    check_or_exit(run.config, precision_of(run.config, run.plan), rank, local_rank, versions_only=versions_only)


def precision_of(cfg: Config, plan: Plan) -> str:
    """The lowest precision a run's GEMMs use, as min_compute_capability names it."""
    dtype = cfg.dtype
    if dtype.fp4:
        return str(dtype.fp4)
    if plan.fp8:
        return "mxfp8" if dtype.fp8_recipe == Fp8Recipe.mxfp8 else "fp8"
    return "bf16"


# --------------------------------------------------------------------------- installing
def _cuda_major() -> str:
    import torch

    if not torch.version.cuda:
        raise SystemExit("stack: this torch has no CUDA (torch.version.cuda is None); start from a CUDA base image")
    return torch.version.cuda.split(".")[0]


def requirement(component: StackPackage, cuda_major: Callable[[], str] = _cuda_major) -> str:
    """`megatron-core==0.19.2`, `transformer-engine[pytorch,core_cu13]==2.20.2`: the tested version."""
    extras = [e.format(cuda_major=cuda_major()) if "{cuda_major}" in e else e for e in component.extras]
    return f"{component.distribution}{'[' + ','.join(extras) + ']' if extras else ''}=={component.tested}"


def missing_requirements(
    declared: StackConfig,
    found: Mapping[str, Found],
    installed: Callable[[str], str | None] | None = None,
    cuda_major: Callable[[], str] | None = None,
) -> list[str]:
    """Pip requirements for what is missing or outside its range; components first (pinned to the tested
    version), then the project's own requirements."""
    from packaging.requirements import Requirement

    installed = installed or installed_version
    cuda_major = cuda_major or _cuda_major
    out = []
    for name in COMPONENTS:
        component, what = component_of(declared, name), found[name]
        if what.version is not None and in_range(what.version, component.supported):
            continue
        if not component.install:
            raise SystemExit(
                f"stack: {component.distribution} {what.version or 'missing'} does not satisfy "
                f"{component.supported}, and it comes with the base image: start from a base with "
                f"{component.distribution} {component.supported} "
                f"(tested {component.tested})"
            )
        out.append(requirement(component, cuda_major))
    for text in declared.requirements:
        req = Requirement(text)
        version = installed(req.name)
        if version is None or not req.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


def pip_command(requirements: Sequence[str], wheel_dir: str | None, constraints: str | None) -> list[str]:
    # No build isolation: Transformer Engine's torch extension must build against the torch that is here.
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation"]
    if wheel_dir:
        cmd += ["--no-index", "--find-links", wheel_dir]
    if constraints:
        cmd += ["--constraint", constraints]
    return cmd + list(requirements)


def _to_install(declared: StackConfig, say: Callable[[str], None]) -> tuple[dict[str, Found], list[str]] | None:
    """(what is installed, the requirements to add); None, said, when there is no torch to build on."""
    found = discover_installed(declared)
    if found["torch"].version is None:
        say(f"stack: torch is not installed here; start from a base image with torch {declared.torch.supported}")
        return None
    return found, missing_requirements(declared, found)


def install(
    declared: StackConfig, wheel_dir: str | None = None, dry_run: bool = False, say: Callable[[str], None] = print
) -> int:
    wanted = _to_install(declared, say)
    if wanted is None:
        return 2
    found, todo = wanted
    if not todo:
        say("stack: everything conf/stack.yaml declares is here; nothing to install")
        return 0
    constraints = _torch_constraint(found)
    command = pip_command(todo, wheel_dir, constraints)
    say("stack: " + " ".join(command))
    try:
        if dry_run:
            return 0
        code = subprocess.run(command).returncode
    finally:
        os.unlink(constraints)
    if code:
        say(
            f"stack: pip failed (exit status {code})"
            + (
                "; the wheel directory lacks what pip names above: fill it "
                "with python -m recipes.stack wheels DIR on a machine with the same image and a package index"
                if wheel_dir
                else "; without a package index, pass --wheel-dir (python -m recipes.stack wheels DIR makes one)"
            )
        )
        return code
    remaining = problems(declared, discover_installed(declared))
    if remaining:
        say(error_line(remaining))
        return 2
    say("stack: installed; the interpreter now has the declared stack")
    return 0


def _torch_constraint(found: Mapping[str, Found]) -> str:
    """A constraints file that holds the base image's torch: no dependency may replace it."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="stack-constraints-", delete=False) as f:
        f.write(f"torch=={found['torch'].version}\n")
    return f.name


def fetch_commands(report: Mapping[str, Any], dest: str) -> list[list[str]]:
    """From pip's installation report (pip install --dry-run --report): each package pip would install, as the
    exact file it chose; wheels are downloaded, source archives built into wheels here (Transformer Engine's torch
    extension builds against this machine's torch, which is why this runs on the image an air-gapped cluster
    uses)."""
    commands = []
    for item in report.get("install", []):
        url = item["download_info"]["url"]
        if url.endswith(".whl"):
            commands.append([sys.executable, "-m", "pip", "download", "--no-deps", "-d", dest, url])
        else:
            commands.append(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dest, url]
            )
    return commands


def wheels(declared: StackConfig, dest: str, say: Callable[[str], None] = print) -> int:
    """Fill `dest` with every wheel `install` would need here, dependencies included, for an air-gapped machine
    that runs the same image: run it where a package index is reachable."""
    import json

    wanted = _to_install(declared, say)
    if wanted is None:
        return 2
    found, todo = wanted
    if not todo:
        say("stack: everything conf/stack.yaml declares is here; no wheels are needed for this image")
        return 0
    constraints = _torch_constraint(found)
    report_path = constraints + ".report.json"
    try:
        resolve = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--no-build-isolation",
            "--constraint",
            constraints,
            "--report",
            report_path,
            *todo,
        ]
        if subprocess.run(resolve).returncode:
            say("stack: pip could not resolve " + " ".join(todo))
            return 1
        with open(report_path) as f:
            commands = fetch_commands(json.load(f), dest)
    finally:
        for path in (constraints, report_path):
            if os.path.exists(path):
                os.unlink(path)
    os.makedirs(dest, exist_ok=True)
    for index, command in enumerate(commands, start=1):
        say(f"stack: [{index}/{len(commands)}] {os.path.basename(command[-1])}")
        if subprocess.run([*command[:-1], "--quiet", command[-1]]).returncode:
            say(f"stack: fetching {command[-1]} failed")
            return 1
    say(
        f"stack: {len(commands)} wheels in {dest}; on the air-gapped machine: python -m recipes.stack install "
        f"--wheel-dir {dest}"
    )
    return 0


# --------------------------------------------------------------------------- the table
def table(declared: StackConfig, found: Mapping[str, Found], gpu: GpuFound | None) -> str:
    rows = [("component", "found", "supported", "tested", "")]
    python = ".".join(map(str, sys.version_info[:3]))
    rows.append(
        (
            "python",
            python,
            declared.python.supported,
            declared.python.tested,
            "ok" if in_range(python, declared.python.supported) else "MISMATCH",
        )
    )
    for name, what in found.items():
        component = component_of(declared, name)
        ok = what.version is not None and what.version != "unknown" and in_range(what.version, component.supported)
        rows.append(
            (
                component.distribution,
                what.version or f"missing ({what.error})",
                component.supported,
                component.tested,
                "ok" if ok else "MISMATCH",
            )
        )
    if gpu is not None:
        capability = ".".join(map(str, gpu.capability)) if gpu.capability else "-"
        rows.append(
            (
                "GPU",
                f"{gpu.name or 'none'} (sm {capability})",
                f">= {declared.min_compute_capability['bf16']} (fp8: {declared.min_compute_capability['fp8']})",
                "",
                "ok" if gpu.capability else "MISSING",
            )
        )
        rows.append(("NCCL", gpu.nccl or "missing", "", "", "ok" if gpu.nccl else "MISSING"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.stack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    check = sub.add_parser("check", help="exit 2 with one line when the stack does not match")
    check.add_argument("--run-dir", help="check for this run (its config.yaml and precision)")
    check.add_argument(
        "--versions-only",
        action="store_true",
        help="the versions from the installed packages' metadata: nothing imported where that tells, no GPU looked at",
    )
    inst = sub.add_parser("install", help="pip-install what is missing or outside the declared range")
    inst.add_argument("--wheel-dir", help="install only from this directory of wheels (no package index)")
    inst.add_argument("--dry-run", action="store_true", help="print the pip command, install nothing")
    fetch = sub.add_parser(
        "wheels",
        help="download (and build) every wheel install would need here, dependencies "
        "included, into DIR: for air-gapped machines running the same image",
    )
    fetch.add_argument("dest", metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "check":
        if args.run_dir:
            check_run(args.run_dir, versions_only=args.versions_only)
        else:
            check_or_exit(None, "bf16", versions_only=args.versions_only)
        print("stack: ok")
        return 0
    declared = load_declared()
    if args.command == "install":
        return install(declared, args.wheel_dir, args.dry_run)
    if args.command == "wheels":
        return wheels(declared, args.dest)
    found = discover_all(declared)
    gpu = discover_gpu() if found["torch"].version is not None else None
    print(table(declared, found, gpu))
    # The GPU is shown for information (a login node has none); each run checks it for its precision.
    return 1 if problems(declared, found) else 0


if __name__ == "__main__":
    sys.exit(main())
