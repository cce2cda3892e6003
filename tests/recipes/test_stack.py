"""The declared training stack (conf/stack.yaml): the check every rank runs first, with faked discoveries (no
other versions installed), the installer's choices, and the places that must name the same versions."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common import stack
from common.config import StackPackage
from common.stack import Found, GpuFound
from common.typed import changed
from launcher.config.compose import compose

REPO = Path(__file__).resolve().parents[2]
DECLARED = stack.load_declared()
AS_TESTED = {
    "torch": Found("2.11.0+cu130"),
    "megatron_core": Found(DECLARED.megatron_core.tested),
    "transformer_engine": Found(DECLARED.transformer_engine.tested + "+a1b2c3d"),
}
H100 = GpuFound("NVIDIA H100 80GB HBM3", (9, 0), "2.27.5")


def with_found(**changes) -> dict:
    return {**AS_TESTED, **changes}


def test_the_declared_stack_passes_for_bf16_and_fp8():
    for precision in ("bf16", "fp8"):
        assert stack.problems(DECLARED, AS_TESTED, H100, precision, python="3.12.3") == []


@pytest.mark.parametrize(
    "component, version, needed",
    [
        ("megatron_core", "0.14.0", ">=0.19.2,<0.20"),  # what the NeMo 25.09 container ships
        ("megatron_core", "0.20.0", ">=0.19.2,<0.20"),
        ("transformer_engine", "2.7.0", ">=2.20,<2.21"),
    ],
)
def test_a_version_outside_the_range_is_one_line_naming_found_needed_and_the_fix(component, version, needed):
    found_problems = stack.problems(DECLARED, with_found(**{component: Found(version)}), H100, python="3.12.3")
    assert len(found_problems) == 1
    line = stack.error_line(found_problems)
    assert "\n" not in line
    assert f"{stack.component_of(DECLARED, component).distribution} {version} found, {needed} needed" in line
    assert "stages=[container]" in line and "stack_check=false" in line


def test_a_missing_package_names_the_import_error():
    missing = Found(None, "ModuleNotFoundError: No module named 'transformer_engine'")
    (problem,) = stack.problems(DECLARED, with_found(transformer_engine=missing), H100, python="3.12.3")
    assert problem.startswith("transformer-engine not importable (ModuleNotFoundError")


def test_fp8_needs_an_fp8_gpu_and_bf16_an_ampere_one():
    a100 = GpuFound("NVIDIA A100-SXM4-80GB", (8, 0), "2.27.5")
    assert stack.problems(DECLARED, AS_TESTED, a100, "bf16", python="3.12.3") == []
    (problem,) = stack.problems(DECLARED, AS_TESTED, a100, "fp8", python="3.12.3")
    assert "fp8 needs compute capability 8.9" in problem and "A100" in problem and "dtype=bf16" in problem
    v100 = GpuFound("Tesla V100-SXM2-32GB", (7, 0), "2.27.5")
    assert "bf16 needs compute capability 8.0" in stack.problems(DECLARED, AS_TESTED, v100, "bf16", python="3.12.3")[0]


def test_no_gpu_and_no_nccl_are_named():
    found_problems = stack.problems(DECLARED, AS_TESTED, GpuFound(None, None, None), python="3.12.3")
    assert found_problems == [
        "no CUDA GPU visible to this process",
        "torch has no NCCL (torch.distributed.is_nccl_available() is false)",
    ]


def test_an_old_python_is_named():
    assert stack.problems(DECLARED, AS_TESTED, H100, python="3.9.18") == ["Python 3.9.18 found, >=3.10 needed"]


def test_only_rank_0_prints_and_every_rank_exits_2(monkeypatch, capsys):
    def discover_all(declared, names, imports):
        assert imports, "a training rank's check imports the components: it finds an installed but broken one"
        return with_found(megatron_core=Found("0.14.0"))

    monkeypatch.setattr(stack, "discover_all", discover_all)
    monkeypatch.setattr(stack, "discover_gpu", lambda local_rank: H100)
    for rank in (1, 0):
        with pytest.raises(SystemExit) as exit_info:
            stack.check_or_exit(None, "bf16", rank=rank)
        assert exit_info.value.code == 2
        printed = capsys.readouterr().err
        assert printed.count("\n") == (1 if rank == 0 else 0), printed
    accepted = changed(compose([]), {"stack_check": False})
    assert stack.check_or_exit(accepted, "bf16") is None  # accepted risk: no check at all


# ----------------------------------------------------------------------------- discovery
def fake(module: str, distribution: str) -> StackPackage:
    """A declared component named as a fake package under the test's directory."""
    return dataclasses.replace(DECLARED.megatron_core, module=module, distribution=distribution)


def _fake_package(root: Path, name: str, version: str, metadata: bool) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"__version__ = {version!r}\n")
    if metadata:
        info = root / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_an_installed_package_is_read_from_its_metadata_without_importing_it(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(_fake_package(tmp_path / "site", "stackfake_a", "1.0", metadata=True)))
    assert stack.discover(fake("stackfake_a", "stackfake-a")) == Found("1.0")
    assert "stackfake_a" not in sys.modules


def test_a_copy_earlier_on_the_path_is_imported_for_its_own_version(monkeypatch, tmp_path):
    # PYTHONPATH=/opt/megatron-lm over an installed megatron-core: the import loads the checkout, not the wheel.
    monkeypatch.syspath_prepend(str(_fake_package(tmp_path / "site", "stackfake_b", "1.0", metadata=True)))
    monkeypatch.syspath_prepend(str(_fake_package(tmp_path / "checkout", "stackfake_b", "0.5", metadata=False)))
    monkeypatch.delitem(sys.modules, "stackfake_b", raising=False)
    assert stack.discover(fake("stackfake_b", "stackfake-b")) == Found("0.5")
    sys.modules.pop("stackfake_b", None)


def test_a_package_that_is_not_there_names_the_import_error():
    found = stack.discover(fake("stackfake_none.core", "stackfake-none"))
    assert found == Found(None, "ModuleNotFoundError: No module named 'stackfake_none'")


def test_the_table_and_data_preparations_check_import_neither_torch_nor_megatron():
    script = (
        "import importlib.metadata as md, sys\n"
        "from common import stack\n"
        "found = stack.discover_all(stack.load_declared(), ('torch', 'megatron_core'))\n"
        "def installed(name):\n"
        "    try:\n"
        "        return md.version(name)\n"
        "    except md.PackageNotFoundError:\n"
        "        return None\n"
        "print([(f.version, installed(n)) for n, f in zip(('torch', 'megatron-core'), found.values())])\n"
        "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    versions, imported = result.stdout.splitlines()
    assert imported == "[]", result.stdout
    for version, installed in eval(versions):
        assert version == installed or installed is None, versions


def test_torch_build_reads_what_torch_itself_says():
    torch = pytest.importorskip("torch")
    assert stack.torch_build() == {"cuda": torch.version.cuda, "hip": torch.version.hip}


def test_a_cpu_build_of_torch_sees_no_gpu_and_no_nccl_without_being_imported(monkeypatch):
    monkeypatch.setattr(stack, "torch_build", lambda: {"cuda": None, "hip": None})
    monkeypatch.setitem(sys.modules, "torch", None)  # an import would fail
    assert stack.discover_gpu() == GpuFound(None, None, None)


# ----------------------------------------------------------------------------- real processes, bad stack
def _run_dir(tmp_path, *overrides) -> Path:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "main.py"),
            "dry_run=true",
            f"results_dir={tmp_path}",
            "run_name=stack",
            *overrides,
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return tmp_path / "stack"


def test_training_with_a_bad_stack_exits_2_with_one_line_before_the_model_is_built(tmp_path):
    # The range is one no release satisfies, so this fails whatever this machine has installed.
    run_dir = _run_dir(tmp_path, "stack.megatron_core.supported='>=99'")
    for command in (
        ["-m", "recipes.train", "--run-dir", str(run_dir)],
        ["-m", "recipes.stack", "check", "--run-dir", str(run_dir)],
        ["-m", "recipes.stack", "check", "--run-dir", str(run_dir), "--versions-only"],  # a local launch script's
    ):
        result = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(errors) == 1 and "megatron-core" in errors[0] and ">=99 needed" in errors[0], result.stderr
        assert "[recipes]" not in result.stdout  # the trainer printed nothing: it never started


def test_the_check_before_the_ranks_imports_neither_torch_nor_megatron(tmp_path):
    # The launch script's check before torchrun: each rank imports the stack next, and checks it then.
    run_dir = _run_dir(tmp_path)
    script = (
        "import sys\n"
        "from common import stack\n"
        "try:\n"
        f"    stack.main(['check', '--run-dir', {str(run_dir)!r}, '--versions-only'])\n"
        "except SystemExit:\n"
        "    pass  # whether this machine's stack matches is not the point\n"
        "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout + result.stderr


def test_data_preparation_with_a_bad_stack_exits_2(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    run_dir = _run_dir(
        tmp_path,
        "stages=[data_preparation]",
        "data_preparation=files",
        f"data_preparation.inputs=[{tmp_path / 'in.jsonl'}]",
        f"data_preparation.output_dir={tmp_path / 'out'}",
        "stack.torch.supported='>=99'",
    )
    result = subprocess.run(
        [sys.executable, "-m", "data_prep", "run", "--config", str(run_dir / "config.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "torch" in result.stderr and ">=99 needed" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.bin"))


# ----------------------------------------------------------------------------- installing
def installed(name: str) -> str:
    """A version of `name` that meets the declared requirement: the stack as an image would have it."""
    from packaging.requirements import Requirement

    for text in DECLARED.requirements:
        req = Requirement(text)
        if req.name == name:
            return next(v for v in ("99.0", "4.9.9", "2.3.0", "1.3.2") if req.specifier.contains(v))
    return "1.0"


def test_the_installer_adds_only_what_is_missing_or_out_of_range():
    ok = stack.missing_requirements(DECLARED, AS_TESTED, installed, cuda_major=lambda: "13")
    assert ok == []  # a base that already has the stack is left as it is
    old = with_found(megatron_core=Found("0.14.0"), transformer_engine=Found(None, "not installed"))
    todo = stack.missing_requirements(
        DECLARED, old, lambda name: None if name == "zstandard" else installed(name), cuda_major=lambda: "12"
    )
    assert todo == [
        f"megatron-core=={DECLARED.megatron_core.tested}",
        f"transformer-engine[pytorch,core_cu12]=={DECLARED.transformer_engine.tested}",
        "zstandard",
    ]


def test_the_base_images_torch_is_never_replaced():
    with pytest.raises(SystemExit, match="comes with the base image"):
        stack.missing_requirements(
            DECLARED, with_found(torch=Found("2.1.0")), lambda name: "9.9", cuda_major=lambda: "12"
        )


def test_air_gapped_installs_read_only_the_wheel_directory():
    command = stack.pip_command(["megatron-core==0.19.2"], "/shared/wheels", "/tmp/c.txt")
    assert command[1:] == [
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "--no-index",
        "--find-links",
        "/shared/wheels",
        "--constraint",
        "/tmp/c.txt",
        "megatron-core==0.19.2",
    ]


def test_install_with_nothing_to_do_runs_no_pip(monkeypatch):
    monkeypatch.setattr(stack, "discover_installed", lambda declared: AS_TESTED)
    monkeypatch.setattr(stack, "installed_version", installed)
    monkeypatch.setattr(stack.subprocess, "run", lambda *a, **k: pytest.fail(f"pip ran: {a}"))
    said = []
    assert stack.install(DECLARED, say=said.append) == 0
    assert said == ["stack: everything conf/stack.yaml declares is here; nothing to install"]


# ----------------------------------------------------------------------------- one declaration
def test_the_dockerfile_names_the_declared_versions_and_the_default_base():
    dockerfile = (REPO / "Dockerfile").read_text()
    labels = dict(re.findall(r'io\.llama31-recipes\.([\w-]+)="([^"]+)"', dockerfile))
    assert labels == {
        "megatron-core": DECLARED.megatron_core.tested,
        "transformer-engine": DECLARED.transformer_engine.tested,
        "torch-tested": DECLARED.torch.tested,
        "python-tested": DECLARED.python.tested,
    }
    assert "python -m recipes.stack install" in dockerfile
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M).group(1)
    bcm = yaml.safe_load((REPO / "conf" / "cluster" / "bcm.yaml").read_text())
    assert base == bcm["container_source"].replace("#", "/")  # enroot writes registry#image


def _names(requirements) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_pyproject_and_the_declared_stack_list_the_same_gpu_side_packages():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    listed = _names(project["dependencies"] + extras["dataprep"] + extras["mlperf"] + extras["train"])
    listed -= {"torch", "transformer-engine"}  # the components, checked below
    assert _names(DECLARED.requirements) <= listed
    train = project["optional-dependencies"]["train"]
    assert f"megatron-core=={DECLARED.megatron_core.tested}" in train
    assert f"transformer-engine[pytorch]=={DECLARED.transformer_engine.tested}" in train
    assert f"torch{DECLARED.torch.supported}" in train
    assert listed - _names(DECLARED.requirements) <= {"megatron-core"}  # nothing undeclared on the GPU side


def test_the_wheels_for_an_air_gapped_machine_are_the_files_pip_chose_dependencies_included():
    report = {
        "install": [
            {
                "metadata": {"name": "megatron-core", "version": "0.19.2"},
                "download_info": {
                    "url": "https://files.example/megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl"
                },
            },
            {
                "metadata": {"name": "transformer-engine-torch", "version": "2.20.2"},
                "download_info": {"url": "https://files.example/transformer_engine_torch-2.20.2.tar.gz"},
            },
            {
                "metadata": {"name": "importlib-metadata", "version": "10.2.0"},
                "download_info": {"url": "https://files.example/importlib_metadata-10.2.0-py3-none-any.whl"},
            },
        ]
    }
    commands = [c[1:] for c in stack.fetch_commands(report, "/w")]
    assert commands == [
        ["-m", "pip", "download", "--no-deps", "-d", "/w", report["install"][0]["download_info"]["url"]],
        # A source archive is built here, against this image's torch.
        [
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            "/w",
            report["install"][1]["download_info"]["url"],
        ],
        ["-m", "pip", "download", "--no-deps", "-d", "/w", report["install"][2]["download_info"]["url"]],
    ]


def test_wheels_resolves_through_pip_and_fetches_what_install_would_need(monkeypatch, tmp_path):
    # A small pure package this environment does not have, standing in for what a base image lacks.
    monkeypatch.setattr(stack, "missing_requirements", lambda declared, found, **kw: ["tomli-w==1.2.0"])
    said = []
    code = stack.wheels(DECLARED, str(tmp_path / "wheels"), say=said.append)
    if code == 1 and any("could not resolve" in s for s in said):
        pytest.skip("no package index reachable from here")
    assert code == 0, said
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == ["tomli_w-1.2.0-py3-none-any.whl"]
    assert said[-1].endswith(f"python -m recipes.stack install --wheel-dir {tmp_path / 'wheels'}")
