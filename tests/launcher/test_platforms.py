"""The platform base class (launcher/platforms/base.py): the registry, what each platform can run and how the rest
is refused, the lines after a submission, and a new platform written as its docstring says."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ClusterConfig, PlatformName
from common.typed import changed
from launcher.config.compose import compose
from launcher.jobs.render import Job
from launcher.jobs.submit import Submitted
from launcher.plan.errors import PlanError
from launcher.platforms.base import Platform
from launcher.platforms.registry import platform_named, platform_of

RUN = Path("/results/run")
# The conf/cluster/ option of each platform.
OPTION = {"local": "local", "slurm": "bcm", "sge": "sge", "bcp": "bcp", "k8s": "k8s"}

# What each platform runs besides data preparation and training (docs/run.md: Stages).
CAN = {
    "local": {"container", "preflight", "export", "nsys"},
    "slurm": {"container", "preflight", "export", "nsys"},
    "sge": {"container", "export"},
    "bcp": set(),
    "k8s": set(),
}


def test_every_platform_the_schema_names_is_the_platform_of_its_module():
    for name in PlatformName:
        platform = platform_named(name)
        assert isinstance(platform, Platform) and platform.name == name


@pytest.mark.parametrize("name", list(CAN))
def test_each_platform_is_the_one_of_its_cluster_keys(name):
    cfg = compose([f"cluster={OPTION[name]}"])
    platform = platform_of(cfg.cluster)
    assert platform.name == name and platform.cluster_of(cfg) is cfg.cluster
    other = compose(["cluster=local" if name != "local" else "cluster=bcm"])
    with pytest.raises(TypeError):
        platform.cluster_of(other)


@pytest.mark.parametrize("name", list(CAN))
def test_what_each_platform_supports(name):
    platform = platform_named(PlatformName(name))
    assert {need for need in ("container", "preflight", "export", "nsys") if platform.supports(need)} == CAN[name]


@pytest.mark.parametrize("name", ["sge", "bcp", "k8s"])
def test_a_refused_stage_is_refused_by_the_checks_and_by_its_job_in_the_same_words(name):
    platform = platform_named(PlatformName(name))
    nsys = {"cluster.name": f"my-{name}", "profile.enabled": True, "profile.tool": "nsys"}
    cfg = changed(compose([f"cluster={OPTION[name]}"]), nsys)
    refused = platform.refusals(cfg, ["container", "preflight", "training", "export"])
    assert len(refused) == 4 - len(CAN[name]) and all(f"cluster=my-{name}" in line for line in refused)
    jobs = {
        "container": lambda: platform.container_job(cfg, RUN),
        "preflight": lambda: platform.preflight_job(cfg, None, RUN),
        "export": lambda: platform.export_job(cfg, RUN),
        "nsys": lambda: platform.rank_entry(cfg, RUN),
    }
    for need in set(jobs) - CAN[name]:
        with pytest.raises(PlanError) as err:
            jobs[need]()
        assert err.value.problems[0] in refused


def test_nothing_is_refused_where_nothing_unsupported_is_asked():
    cfg = changed(compose(["cluster=bcp"]), {"profile.enabled": False, "profile.tool": "nsys"})
    assert platform_of(cfg.cluster).refusals(cfg, ["data_preparation", "training"]) == []


def _jobs(*stages: str) -> list[Job]:
    return [
        Job(stage, f"{stage}.x", stage, [], array_size=3 if stage == "data_preparation" else None) for stage in stages
    ]


def _submitted(dependency: str, *stages: str) -> list[Submitted]:
    return [
        Submitted(stage, str(100 + i), f"{stage}.x", f"{dependency}:{99 + i}" if i else None)
        for i, stage in enumerate(stages)
    ]


@pytest.mark.parametrize(
    "name,dependency,expected",
    [
        (
            "slurm",
            "afterok",
            [
                f"submitted data_preparation: job 100; log {RUN}/logs/data_preparation_100_*.out",
                f"submitted training: job 101 (--dependency=afterok:100); log {RUN}/logs/training_101.out",
                f"  follow with: squeue -j 100,101   report: python -m launcher.report {RUN}",
            ],
        ),
        (
            "sge",
            "hold_jid",
            [
                f"submitted data_preparation: job 100; log {RUN}/logs/data_preparation_100_*.out",
                f"submitted training: job 101 (-hold_jid 100); log {RUN}/logs/training_101.out",
                f"  follow with: qstat -j 100,101   report: python -m launcher.report {RUN}",
            ],
        ),
        (
            "bcp",
            "succeeded",
            [
                f"submitted data_preparation: job 100; log {RUN}/logs/data_preparation_100.log",
                f"submitted training: job 101 (after 100 finished); log {RUN}/logs/training_101.log",
                f"  follow with: ngc base-command job info 101   report: python -m launcher.report {RUN}",
            ],
        ),
        (
            "k8s",
            "succeeded",
            [
                "submitted data_preparation: job 100",
                "submitted training: job 101 (after 100 completed)",
                f"  follow with: kubectl logs -f job/101   report: python -m launcher.report {RUN}",
            ],
        ),
    ],
)
def test_the_lines_after_a_submission(name, dependency, expected):
    platform = platform_named(PlatformName(name))
    stages = ("data_preparation", "training")
    assert platform.follow(_jobs(*stages), _submitted(dependency, *stages), RUN) == expected


def test_jobs_that_run_here_have_no_chain_to_print():
    cfg = compose(["cluster=local"])
    local = platform_of(cfg.cluster)
    assert local.runs_here and local.chain_as_shell(_jobs("training"), RUN, cfg) == []


class Toy(Platform[ClusterConfig]):
    """A platform written from base.py's docstring alone: the attributes, the two jobs, its own script."""

    name = "toy"
    cluster_class = ClusterConfig
    suffix = ".toy"
    resubmit = "toysub"
    client = "toysub"
    chain = "each job after the previous one"

    def data_preparation_jobs(self, cfg, run_dir, num_shards):
        return [self.job("data_preparation", "prepare", ["prep"], array_size=num_shards)]

    def training_job(self, cfg, plan, run_dir, entry):
        return self.job("training", "train", [" ".join(entry)], env={"A": "b c"}), " ".join(entry)

    def render_script(self, job, cfg, run_dir):
        return "\n".join(["#!/bin/sh", *self.header_lines(job, run_dir), *self.env_lines(job), *job.lines, ""])

    def waits_for(self, dependency):
        return dependency

    def follow_command(self, submitted):
        return "toystat"


def test_a_new_platform_needs_only_what_the_docstring_lists():
    toy = Toy()
    cfg = changed(compose(["cluster=bcm"]), {"cluster.name": "toy", "profile.enabled": False})
    job, command = toy.training_job(cfg, None, RUN, toy.rank_entry(cfg, RUN))
    assert job.script == "submission.toy" and command == f"python -m recipes.train --run-dir {RUN}"
    text = toy.render(job, cfg, RUN)["submission.toy"]
    assert f"# Written by main.py for run; submit it again with: toysub {RUN}/submission.toy" in text
    assert "export A='b c'" in text and "export PYTHONPATH=" in text
    assert toy.script_name("data_check") == "data_check.toy" and not toy.runs_here
    assert toy.supports("container") and not toy.supports("preflight") and not toy.supports("export")
    assert toy.refusals(cfg, ["preflight", "training"]) == [
        "stages has preflight but cluster=toy has no preflight job yet: drop preflight from stages, or run it on "
        "cluster=local or a Slurm cluster"
    ]


def test_a_platform_without_its_script_cannot_be_made():
    class Half(Toy):
        render_script = Platform.render_script

    with pytest.raises(TypeError, match="render_script"):
        Half()
