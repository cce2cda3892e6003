"""Container runtimes and the container stage: the image build runs for real on this machine against stand-in
`enroot` and `apptainer` commands that record their arguments and create the files they would, so the order of
the steps, the mounts, the atomic rename and the clean-up after a failed install are checked end to end."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from launcher.cli import prepare
from launcher.plan.errors import PlanError

from launcher_helpers import REPO, run_main

FAKE_ENROOT = r"""#!/bin/bash
# Records its arguments; creates what enroot would. FAIL_AT=<subcommand> makes that step fail.
echo "enroot $*" >> "$TOOL_LOG"
[ "${FAIL_AT:-}" != "$1" ] || { echo "enroot $1: failed" >&2; exit 3; }
case "$1" in
    import) shift; [ "$1" = --output ] && echo base > "$2" ;;
    create) mkdir -p "$ENROOT_DATA_PATH/$3" ;;
    export) shift; [ "$1" = --output ] && echo image > "$2" ;;
    remove) rm -rf "$ENROOT_DATA_PATH/${3:?}" ;;
esac
"""

FAKE_APPTAINER = r"""#!/bin/bash
echo "apptainer $*" >> "$TOOL_LOG"
[ "${FAIL_AT:-}" != "$1" ] || { echo "apptainer $1: failed" >&2; exit 3; }
if [ "$1" = build ]; then
    args=("$@"); output=${args[$# - 2]}; definition=${args[$# - 1]}
    cp "$definition" "$TOOL_LOG.def" && echo sif > "$output"
fi
"""


def install_tool(bin_dir: Path, name: str, text: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def build(tmp_path: Path, image: Path, *overrides: str, fail_at: str = "") -> tuple[int, list[str], str]:
    """main.py stages=[container] cluster=local (runs the build here); (exit status, tool calls, stderr)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "tool.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TOOL_LOG": str(log),
        "FAIL_AT": fail_at,
        "ENROOT_DATA_PATH": str(tmp_path / "enroot-data"),
    }
    out = run_main(
        "stages=[container]", f"cluster.container={image}", f"results_dir={tmp_path}/results", *overrides, env=env
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return out.returncode, calls, out.stderr


def test_enroot_build_imports_installs_the_stack_and_renames_when_complete(tmp_path):
    install_tool(tmp_path / "bin", "enroot", FAKE_ENROOT)
    image = tmp_path / "images" / "llama31.sqsh"
    code, calls, err = build(tmp_path, image)
    assert code == 0, err
    assert [c.split()[1] for c in calls] == ["import", "create", "start", "export", "remove"]
    name = calls[1].split()[3]
    assert calls[0] == f"enroot import --output {image}.base.partial docker://nvcr.io#nvidia/nemo:25.09"
    assert calls[2] == (
        f"enroot start --root --rw --mount {REPO}:{REPO} --env PYTHONPATH={REPO} {name} "
        f"bash -c cd {REPO} && python -m recipes.stack install"
    )
    assert calls[3] == f"enroot export --output {image}.partial {name}" and calls[4].endswith(f" {name}")
    assert image.read_text() == "image\n"
    assert sorted(p.name for p in image.parent.iterdir()) == ["llama31.sqsh"]  # no partial file left
    assert not any((tmp_path / "enroot-data").iterdir())  # the unpacked build container is gone

    code, again, err = build(tmp_path, image)
    assert code == 0 and again == calls, err  # the image exists: nothing runs a second time


def test_a_failed_install_leaves_no_image_and_no_temporary_files(tmp_path):
    install_tool(tmp_path / "bin", "enroot", FAKE_ENROOT)
    image = tmp_path / "images" / "llama31.sqsh"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    code, calls, _ = build(tmp_path, image, f"cluster.wheel_dir={wheels}", fail_at="start")
    assert code == 3
    assert [c.split()[1] for c in calls] == ["import", "create", "start", "remove"]
    assert f"--mount {wheels}:{wheels}" in calls[2] and calls[2].endswith(f"install --wheel-dir {wheels}")
    assert list(image.parent.iterdir()) == []


def test_an_air_gapped_base_on_disk_is_not_imported(tmp_path):
    install_tool(tmp_path / "bin", "enroot", FAKE_ENROOT)
    base = tmp_path / "base.sqsh"
    base.write_text("base\n")
    image = tmp_path / "images" / "llama31.sqsh"
    code, calls, err = build(tmp_path, image, f"cluster.container_source={base}")
    assert code == 0, err
    assert [c.split()[1] for c in calls] == ["create", "start", "export", "remove"]
    assert calls[0].endswith(f" {base}") and base.exists()  # the base is read, never removed


def test_apptainer_build_reads_a_definition_file_with_the_repository_bound(tmp_path):
    install_tool(tmp_path / "bin", "apptainer", FAKE_APPTAINER)
    image = tmp_path / "images" / "llama31.sif"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    code, calls, err = build(tmp_path, image, "cluster.container_runtime=apptainer", f"cluster.wheel_dir={wheels}")
    assert code == 0, err
    (run_dir,) = (tmp_path / "results").iterdir()
    assert calls == [
        f"apptainer build --force --bind={REPO}:{REPO},{wheels}:{wheels} {image}.partial {run_dir}/container.def"
    ]
    definition = (tmp_path / "tool.log.def").read_text()
    assert definition.startswith("Bootstrap: docker\nFrom: nvcr.io/nvidia/nemo:25.09\n")
    assert f"    cd {REPO}\n" in definition
    assert f"    python -m recipes.stack install --wheel-dir {wheels}\n" in definition
    assert image.read_text() == "sif\n" and sorted(p.name for p in image.parent.iterdir()) == ["llama31.sif"]


def test_building_here_needs_the_tool(tmp_path):
    if any(Path(d, "apptainer").exists() for d in os.environ["PATH"].split(os.pathsep)):
        pytest.skip("apptainer is installed on this machine")
    code, _, err = build(tmp_path, tmp_path / "x.sif", "cluster.container_runtime=apptainer")
    assert code == 2 and "apptainer is not installed here" in err


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["cluster.container_runtime=apptainer", "cluster.container=/images/llama31.sqsh"],
            "cluster.container=/images/llama31.sqsh is a .sqsh image but cluster.container_runtime=apptainer runs .sif",
        ),
        (
            ["stages=[container]", "cluster.container_runtime=apptainer", "cluster.container=/images/llama31.sqsh"],
            "cluster.container='/images/llama31.sqsh' is not a .sif path to build into",
        ),
        (["stages=[container]", "cluster.container_runtime=none"], "cluster.container_runtime=none has no image"),
        (["stages=[container]", "cluster.wheel_dir=wheels"], "cluster.wheel_dir=wheels must be an absolute path"),
        (
            [
                "cluster.container_runtime=apptainer",
                "cluster.container=/images/llama31.sif",
                "+cluster.env.NCCL_IB_HCA='mlx5_0,mlx5_1'",
            ],
            "cluster.env.NCCL_IB_HCA='mlx5_0,mlx5_1' contains a comma",
        ),
    ],
)
def test_runtime_problems_name_their_keys(cfg_for, overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        prepare(cfg_for("cluster=bcm", "dry_run=true", *overrides))


def test_runtime_none_is_bare_metal_like_a_null_container(cfg_for):
    def script(*overrides: str) -> str:
        prepared = prepare(cfg_for("cluster=bcm", "training=llama31/8b", "dry_run=true", *overrides))
        (job,) = prepared.stages.jobs
        return prepared.platform.render_script(job, prepared.cfg, prepared.run_dir)

    bare = script("cluster.container_runtime=none")
    assert bare == script("cluster.container_runtime=none")
    assert "--container" not in bare and "apptainer" not in bare and "export PATH=" in bare
