"""bench/bench_train.py's rows: MFU against the bf16 and the fp8 peak, and the ratio to NVIDIA's published row for
the model and dtype (conf/perf/nvidia_h100.yaml), also for layer-count proxies."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from launcher.autoconf.perfdata import NVIDIA_H100, nvidia_reference, training_model
from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.formulas import model_flops_per_sample
from launcher.plan.hardware import gpu_spec

from launcher_helpers import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", REPO / "bench" / "bench_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_dir(tmp_path, overrides, step_time):
    plan = build_plan(
        compose([*overrides, "cluster=bcm", "cluster.gpu_type=h200", "cluster.gpus_per_node=4", "memory_check=false"])
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json_dict()))
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": 5.0, "step_time_s": step_time, "peak_memory_gib": 70.0}) + "\n"
            for i in range(4)
        )
    )
    return plan


@pytest.mark.parametrize(
    "row", yaml.safe_load(NVIDIA_H100.read_text())["rows"], ids=lambda r: f"{r['model']}-{r['dtype']}"
)
def test_published_mfu_is_what_the_plan_formula_gives_for_the_published_throughput(row):
    reference = nvidia_reference(row["model"], row["dtype"])
    mfu = reference.mfu(training_model(row["model"]), row["published_mfu_peak"])
    assert mfu == pytest.approx(row["published_mfu"], rel=0.015)


def test_an_fp8_row_shows_both_peaks_and_its_ratio_to_nvidia(tmp_path):
    plan = _run_dir(
        tmp_path,
        [
            "training=llama31/8b",
            "parallelism=tp1",
            "parallelism.num_gpus=4",
            "dtype=fp8",
            "training.global_batch_size=32",
        ],
        4.4,
    )
    row = _bench().table_row("dp4-fp8", tmp_path, window=2)
    h200 = gpu_spec("h200")
    mfu = 32 * plan.model_flops_per_sample / 4.4 / 4 / h200.bf16_peak_flops
    assert row["mfu_bf16"] == pytest.approx(mfu)
    assert row["mfu_fp8"] == pytest.approx(mfu * h200.bf16_peak_flops / h200.fp8_peak_flops)
    flops_per_token = model_flops_per_sample(training_model("llama31_8b"), 8192) / 8192
    theirs = 14048 * flops_per_token / gpu_spec("h100").bf16_peak_flops
    assert row["nvidia_mfu_bf16"] == pytest.approx(theirs)
    assert row["vs_nvidia"] == pytest.approx(mfu / theirs)
    assert "14,048 tokens/s/GPU on 8 H100" in row["nvidia"] and "DGX Cloud" in row["nvidia"]


def test_a_layer_proxy_compares_with_the_full_models_row(tmp_path):
    plan = _run_dir(
        tmp_path,
        [
            "training=llama31/405b",
            "training.model.num_layers=4",
            "parallelism=custom",
            "parallelism.tp=4",
            "parallelism.num_gpus=4",
            "parallelism.sequence_parallel=true",
            "parallelism.tp_comm_overlap=true",
            "training.global_batch_size=32",
        ],
        12.0,
    )
    row = _bench().table_row("405b-proxy", tmp_path, window=2)
    full = nvidia_reference("llama31_405b", "bf16").mfu(training_model("llama31_405b"))
    assert row["vs_nvidia"] == pytest.approx(row["mfu_bf16"] / full)
    # The proxy's own FLOPs (4 layers) give its MFU; the reference's are the 126-layer model's.
    assert plan.model_flops_per_sample < model_flops_per_sample(training_model("llama31_405b"), 8192) / 10


def test_rows_without_a_reference_print_a_dash(tmp_path, capsys):
    _run_dir(tmp_path, ["training=llama31/tiny", "parallelism=tp1"], 0.1)
    bench = _bench()
    row = bench.table_row("tiny", tmp_path, window=2)
    assert row["vs_nvidia"] is None and row["nvidia"] is None
    bench.print_table([row])
    bench.print_references([row])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[-2] == "-" and "vs NVIDIA" not in line
