"""The `nsys profile` wrapper the launcher puts around the profiled ranks (profile.tool=nsys in
conf/observability.yaml)."""

from __future__ import annotations

import shlex
from pathlib import Path

from common.config import ProfileConfig


def nsys_requested(prof: ProfileConfig) -> bool:
    """profile.tool=nsys on an enabled profile: the profiled ranks run under nsys."""
    return prof.enabled and prof.tool == "nsys"


def nsys_entry(prof: ProfileConfig, run_dir: Path, entry: list[str], rank_var: str) -> list[str] | None:
    """`bash -c SCRIPT` that runs `entry` under `nsys profile` on the ranks in profile.ranks (read from the
    launcher's rank variable, e.g. RANK or SLURM_PROCID) and plainly on the others; None unless profile.tool=nsys.
    The trainer opens and closes the capture at the window (cudaProfilerStart/Stop); `--capture-range-end=stop`
    keeps the run going after it."""
    if not nsys_requested(prof):
        return None
    profile_dir = shlex.quote(str(run_dir / "profile"))
    ranks = " ".join(str(r) for r in prof.ranks)
    nsys = [
        "nsys",
        "profile",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        *[str(a) for a in prof.nsys_args],
    ]
    command = shlex.join(entry)
    script = "\n".join(
        [
            f"mkdir -p {profile_dir}",
            f'if [[ " {ranks} " == *" ${rank_var} "* ]]; then',
            f'  command -v nsys >/dev/null || {{ echo "profile.tool=nsys: nsys (Nsight Systems) is not on PATH on '
            f'$(hostname) for rank ${rank_var}; install it in the job environment or use profile.tool=torch" >&2; '
            "exit 1; }",
            f'  exec {shlex.join(nsys)} --output={profile_dir}/nsys_rank"${rank_var}" {command}',
            "fi",
            f"exec {command}",
        ]
    )
    return ["bash", "-c", script]
