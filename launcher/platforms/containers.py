"""Container runtimes: how a job's commands enter cluster.container (pyxis flags on srun, `apptainer exec`, or
`none`: bare metal), and how the container stage builds that image from cluster.container_source with the
declared stack installed (`python -m recipes.stack install`, which adds only what the base lacks)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Mapping, Union

from common.config import ClusterConfig, Config, ContainerCluster, LocalCluster
from launcher.jobs.commands import REPO, container_mounts

# The clusters whose container stage builds cluster.container (the jobs of slurm and sge also run in it; local
# jobs never do).
ImageCluster = Union[LocalCluster, ContainerCluster]

# Runtime -> the image file it runs and the container stage builds.
IMAGE_SUFFIX = {"pyxis": ".sqsh", "apptainer": ".sif"}
# Runtime -> the tool that builds the image (checked when the build runs on this machine).
BUILD_TOOL = {"pyxis": "enroot", "apptainer": "apptainer"}
RUNTIMES = ("pyxis", "apptainer", "none")


def image_cluster(cluster: ClusterConfig) -> ImageCluster:
    """The cluster of a platform that builds images (Platform.builds_images), with its image keys."""
    if not isinstance(cluster, (LocalCluster, ContainerCluster)):
        raise TypeError(f"cluster.platform={cluster.platform} has no image to build")
    return cluster


def runtime_of(cluster: ImageCluster) -> str:
    """cluster.container_runtime; `none` also when cluster.container is null (bare metal either way)."""
    if not cluster.container:
        return "none"
    return str(cluster.container_runtime)


def runtime_problems(cluster: ImageCluster, allowed: tuple[str, ...]) -> list[str]:
    value = cluster.container_runtime
    if value not in allowed:
        return [
            f"cluster.container_runtime={value!r}: cluster={cluster.name} runs containers with {' or '.join(allowed)}"
        ]
    return []


def build_problems(cluster: ImageCluster, build_here: bool, dry_run: bool) -> tuple[list[str], bool]:
    """(problems, build_needed) for the container stage: the image path must suit the runtime."""
    runtime = cluster.container_runtime
    image = cluster.container
    suffix = IMAGE_SUFFIX.get(runtime)
    if suffix is None:
        return [
            f"stages has container but cluster.container_runtime={runtime} has no image to build; use "
            "pyxis (.sqsh) or apptainer (.sif), or drop container from stages"
        ], False
    if not image or not str(image).endswith(suffix):
        return [
            f"stages has container but cluster.container={image!r} is not a {suffix} path to build into "
            f"(cluster.container_runtime={runtime}); set cluster.container=/abs/path/image{suffix} or drop "
            "container from stages"
        ], False
    if not str(image).startswith("/"):
        return [
            f"cluster.container={image} must be an absolute path ({runtime} resolves relative paths on the "
            "compute node)"
        ], False
    problems = wheel_dir_problems(cluster, dry_run)
    if Path(image).exists():
        return problems, False
    if build_here and not dry_run and shutil.which(BUILD_TOOL[runtime]) is None:
        problems.append(
            f"stages has container with cluster={cluster.name} but {BUILD_TOOL[runtime]} is not "
            "installed here; install it, or build on a compute node (cluster=bcm or cluster=sge)"
        )
    return problems, not problems


def wheel_dir_problems(cluster: ImageCluster, dry_run: bool) -> list[str]:
    wheels = cluster.wheel_dir
    if wheels is None:
        return []
    if not str(wheels).startswith("/"):
        return [f"cluster.wheel_dir={wheels} must be an absolute path (it is mounted at the same path)"]
    if not dry_run and not Path(wheels).is_dir():
        return [
            f"cluster.wheel_dir={wheels} is not a directory; point it at the wheels for the declared stack "
            "(pip download -d DIR ...), or set it to null to install from the package index"
        ]
    return []


def image_problems(cluster: ContainerCluster, dry_run: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) for a job that runs in cluster.container without building it first."""
    runtime, image = runtime_of(cluster), str(cluster.container)
    if runtime == "none":  # no image, or bare metal
        return [], []
    suffix = IMAGE_SUFFIX[runtime]
    other = [s for r, s in IMAGE_SUFFIX.items() if r != runtime and str(image).endswith(s)]
    if other:
        return [
            f"cluster.container={image} is a {other[0]} image but cluster.container_runtime={runtime} runs "
            f"{suffix} images; set cluster.container to a {suffix} path or change the runtime"
        ], []
    if not str(image).endswith(suffix):
        return [], []  # an image reference the runtime pulls itself (docker://..., a registry name)
    if not str(image).startswith("/"):
        return [
            f"cluster.container={image} must be an absolute path ({runtime} resolves relative paths on the "
            "compute node)"
        ], []
    if not Path(image).exists():
        msg = (
            f"cluster.container={image} does not exist: run `bash setup.sh`, add the container stage "
            "(stages=[container,training]), or set cluster.container to an existing image"
        )
        return ([], [msg]) if dry_run else ([msg], [])
    return [], []


# --------------------------------------------------------------------------- running in the image
def apptainer_exec(cfg: Config, cluster: ContainerCluster, env: Mapping[str, str]) -> list[str]:
    """`apptainer exec` with the same mounts, working directory and writability as the pyxis flags. The plan's
    variables are set explicitly (--env wins over values the image defines); everything else, the ranks and
    MASTER_ADDR/MASTER_PORT included, reaches the container from the job's environment as apptainer passes it."""
    args = ["apptainer", "exec", "--nv", f"--bind={','.join(container_mounts(cfg))}", f"--pwd={REPO}", "--no-home"]
    if cluster.container_writable:
        args.append("--writable-tmpfs")
    args += [f"--env={key}={value}" for key, value in env.items()]
    args.append(str(cluster.container))
    return args


def env_problems(cluster: ContainerCluster, env: Mapping[str, str]) -> list[str]:
    """apptainer --env splits its value on commas, so a value holding one cannot be passed that way."""
    if runtime_of(cluster) != "apptainer":
        return []
    return [
        f"cluster.env.{key}={value!r} contains a comma, which apptainer --env cannot pass; set it without one"
        for key, value in env.items()
        if "," in str(value)
    ]


# --------------------------------------------------------------------------- the container stage
def docker_reference(source: str) -> str:
    """enroot writes registry#image:tag; Docker and apptainer write registry/image:tag."""
    return source.replace("#", "/", 1)


def install_command(cluster: ImageCluster) -> list[str]:
    command = ["python", "-m", "recipes.stack", "install"]
    if cluster.wheel_dir:
        command += ["--wheel-dir", str(cluster.wheel_dir)]
    return command


def build_mounts(cluster: ImageCluster) -> list[str]:
    """The repository (the install command and the stack declaration) and the wheels, at their own paths."""
    dirs = [str(REPO)] + ([str(cluster.wheel_dir)] if cluster.wheel_dir else [])
    return [f"{d}:{d}" for d in dirs]


def build_title(cluster: ImageCluster) -> str:
    return f"Build {cluster.container} from {cluster.container_source} with the declared stack (conf/stack.yaml)"


def build_lines(cluster: ImageCluster, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The container stage's shell lines and the files they read (apptainer's definition file)."""
    if cluster.container_runtime == "apptainer":
        return apptainer_build(cluster, run_dir)
    return enroot_build(cluster), {}


def _skip_when_built(image: str) -> list[str]:
    path = shlex.quote(image)
    return [
        f'if [ -f {path} ]; then echo "container: {image} exists; nothing to build"; exit 0; fi',
        f"mkdir -p {shlex.quote(str(Path(image).parent))}",
    ]


def enroot_build(cluster: ImageCluster) -> list[str]:
    """Import the base, unpack it, install the stack into it with the repository mounted, export the .sqsh.
    The image appears only complete (temporary file, then rename); the unpacked copy is removed either way."""
    sqsh, source = str(cluster.container), str(cluster.container_source)
    partial = sqsh + ".partial"
    local_base = source.startswith("/")  # an air-gapped cluster's base image on disk
    base = source if local_base else sqsh + ".base.partial"
    temporary = " ".join(shlex.quote(p) for p in ([partial] if local_base else [base, partial]))
    mounts = " ".join(f"--mount {shlex.quote(m)}" for m in build_mounts(cluster))
    install = shlex.join(["bash", "-c", f"cd {shlex.quote(str(REPO))} && {shlex.join(install_command(cluster))}"])
    lines = [
        *_skip_when_built(sqsh),
        "BUILD=llama31-build-$$",
        f"trap 'enroot remove --force \"$BUILD\" >/dev/null 2>&1 || true; rm -f {temporary}' EXIT",
    ]
    if not local_base:
        lines.append(shlex.join(["enroot", "import", "--output", base, "docker://" + source]))
    lines += [
        f'enroot create --name "$BUILD" {shlex.quote(base)}',
        "# Installs only what the base lacks or has outside the declared versions.",
        f'enroot start --root --rw {mounts} --env PYTHONPATH={shlex.quote(str(REPO))} "$BUILD" {install}',
        f'enroot export --output {shlex.quote(partial)} "$BUILD"',
        f"mv -f {shlex.quote(partial)} {shlex.quote(sqsh)}",
    ]
    return lines


def definition_file(cluster: ImageCluster) -> str:
    source = str(cluster.container_source)
    bootstrap = (
        ["Bootstrap: localimage", f"From: {source}"]
        if source.startswith("/")
        else ["Bootstrap: docker", f"From: {docker_reference(source)}"]
    )
    return "\n".join(
        [
            *bootstrap,
            "",
            "%post",
            "    # The base image's environment (PATH, LD_LIBRARY_PATH, ...), which %post does not read by itself.",
            "    if [ -f /.singularity.d/env/10-docker2singularity.sh ]; then",
            "        . /.singularity.d/env/10-docker2singularity.sh",
            "    fi",
            f"    cd {shlex.quote(str(REPO))}",
            "    # Installs only what the base lacks or has outside the declared versions.",
            f"    {shlex.join(install_command(cluster))}",
            "",
        ]
    )


def apptainer_build(cluster: ImageCluster, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """`apptainer build` from a definition file in the run directory, with the repository bound during %post."""
    sif = str(cluster.container)
    partial = sif + ".partial"
    definition = run_dir / "container.def"
    lines = [
        *_skip_when_built(sif),
        f"trap 'rm -f {shlex.quote(partial)}' EXIT",
        shlex.join(
            ["apptainer", "build", "--force", f"--bind={','.join(build_mounts(cluster))}", partial, str(definition)]
        ),
        f"mv -f {shlex.quote(partial)} {shlex.quote(sif)}",
    ]
    return lines, {definition.name: definition_file(cluster)}
