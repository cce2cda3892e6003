"""A site's own options in a --config-dir (docs/configuration.md: A site's own settings): they compose as conf/'s
do, typed and checked the same way, and --help lists them."""

from __future__ import annotations

import yaml

from launcher_helpers import run_main

SITE_CLUSTER = """\
defaults:
  - bcm
  - _self_
partition: batch
account: myacct
container_runtime: none
env: {NCCL_IB_HCA: mlx5}
"""


def test_a_site_cluster_option_plans_like_a_built_in_one(tmp_path):
    (tmp_path / "site" / "cluster").mkdir(parents=True)
    (tmp_path / "site" / "cluster" / "mysite.yaml").write_text(SITE_CLUSTER)
    results = tmp_path / "results"
    out = run_main(
        "--config-dir",
        str(tmp_path / "site"),
        "cluster=mysite",
        "training=llama31/8b",
        "dry_run=true",
        f"results_dir={results}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    (run_dir,) = results.iterdir()
    cluster = yaml.safe_load((run_dir / "config.yaml").read_text())["cluster"]
    assert (cluster["platform"], cluster["partition"], cluster["account"]) == ("slurm", "batch", "myacct")
    assert cluster["env"]["NCCL_IB_HCA"] == "mlx5"
    assert "#SBATCH --partition=batch" in (run_dir / "submission.sbatch").read_text()


def test_help_lists_the_site_options_beside_the_others(tmp_path):
    (tmp_path / "site" / "cluster").mkdir(parents=True)
    (tmp_path / "site" / "cluster" / "mysite.yaml").write_text(SITE_CLUSTER)
    out = run_main("--help", "--config-dir", str(tmp_path / "site"), cwd=tmp_path)
    assert out.returncode == 0
    (line,) = [line for line in out.stdout.splitlines() if line.strip().startswith("cluster ")]
    assert line.split(None, 1)[1] == "bcm, bcp, k8s, local, mysite, sge"
