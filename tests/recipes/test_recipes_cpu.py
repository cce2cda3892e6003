"""The training recipe's pieces that need no GPU: config mapping, layer split, sampling, checkpoint
bookkeeping, metrics and the Hugging Face weight mapping."""

from dataclasses import astuple, replace
import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from launcher.config.compose import compose
from launcher.plan.build import build_plan
from recipes.hf import mapping
from common import checkpoints
from common.checkpoints import TrainState
from common.plan import PlanFileError, load_plan
from recipes.runtime import stop_signals
from recipes.runtime.callbacks import ERROR, FINISHED, Stop
from recipes.trainer import data, metrics, settings
from recipes.runtime.ranks import rank_info

REPO = Path(__file__).resolve().parents[2]


def plan_for(*overrides):
    cfg = compose(list(overrides))
    return cfg, build_plan(cfg)


# ----------------------------------------------------------------------------- plan.json
def write_plan(run_dir: Path, data) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(data))


def test_plan_json_reads_back_into_the_same_plan(tmp_path):
    _, plan = plan_for("training=llama31/70b", "cluster=bcm", "dtype=fp8")
    write_plan(tmp_path, plan.to_json_dict())
    loaded = load_plan(tmp_path)
    assert loaded == plan and loaded.tp == 4 and loaded.layers_per_pipeline_stage == plan.layers_per_pipeline_stage


def test_a_plan_json_of_another_launcher_version_is_one_line_naming_the_keys(tmp_path):
    _, plan = plan_for()
    data = plan.to_json_dict()
    del data["tp"], data["cannot_train_reason"]
    data["tensor_parallel"] = 1
    write_plan(tmp_path, data)
    with pytest.raises(PlanFileError) as err:
        load_plan(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'plan.json'} was written by another version of the launcher (missing tp, "
        "cannot_train_reason; unknown tensor_parallel); write the run directory again with "
        "this version's python main.py"
    )
    write_plan(tmp_path, [1, 2])
    with pytest.raises(PlanFileError, match="does not hold a plan"):
        load_plan(tmp_path)
    (tmp_path / "plan.json").write_text('{"tp": ')
    with pytest.raises(PlanFileError, match="plan.json is not JSON"):
        load_plan(tmp_path)
    with pytest.raises(PlanFileError, match="does not exist"):
        load_plan(tmp_path / "elsewhere")


def test_a_rank_given_a_foreign_plan_json_stops_with_that_line(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "main.py"), "dry_run=true", f"results_dir={tmp_path}", "run_name=r"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    run_dir = tmp_path / "r"
    data = json.loads((run_dir / "plan.json").read_text())
    write_plan(run_dir, {**data, "expert_parallel": 1})
    rank = subprocess.run(
        [sys.executable, "-m", "recipes.train", "--run-dir", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rank.returncode == 1
    assert rank.stderr.strip().splitlines() == [
        f"error: {run_dir / 'plan.json'} was written by another version of the launcher (unknown expert_parallel); "
        "write the run directory again with this version's python main.py"
    ]


# ----------------------------------------------------------------------------- config mapping
def test_transformer_config_kwargs_follow_plan_and_llama_architecture():
    cfg, plan = plan_for("training=llama31/405b", "cluster=bcm", "dtype=fp8")
    kw = settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=True)
    assert (kw["num_layers"], kw["hidden_size"], kw["ffn_hidden_size"]) == (126, 16384, 53248)
    assert (kw["num_attention_heads"], kw["num_query_groups"], kw["kv_channels"]) == (128, 8, 128)
    assert kw["normalization"] == "RMSNorm" and kw["gated_linear_unit"] and not kw["add_bias_linear"]
    assert kw["activation_func"] is torch.nn.functional.silu
    assert (kw["tensor_model_parallel_size"], kw["pipeline_model_parallel_size"]) == (8, 8)
    assert (kw["virtual_pipeline_model_parallel_size"], kw["context_parallel_size"]) == (8, 2)
    assert kw["account_for_embedding_in_pipeline_split"] and kw["account_for_loss_in_pipeline_split"]
    assert kw["fp8"] == "hybrid" and kw["fp8_recipe"] == "delayed" and kw["fp8_param"]
    assert kw["fp8_amax_history_len"] == 1024 and kw["fp8_amax_compute_algo"] == "max"
    assert kw["tp_comm_overlap"] and kw["sequence_parallel"]
    assert kw["defer_embedding_wgrad_compute"] and kw["wgrad_deferral_limit"] == 50
    assert kw["overlap_p2p_comm"] and not kw["batch_p2p_comm"]
    assert kw["calculate_per_token_loss"]
    assert kw["params_dtype"] is torch.bfloat16 and kw["bf16"]


def test_without_apex_wgrad_deferral_is_off_but_the_rest_is_unchanged():
    cfg, plan = plan_for("training=llama31/70b", "cluster=bcm")
    kw = settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=False)
    assert not kw["gradient_accumulation_fusion"] and not kw["defer_embedding_wgrad_compute"]
    assert kw["wgrad_deferral_limit"] == 0
    assert kw["fp8"] is None and not kw["fp8_param"]


def test_deterministic_mode_sets_config_and_environment():
    cfg, plan = plan_for("training.deterministic=true")
    assert settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=True)["deterministic_mode"]
    environ = {}
    assert settings.apply_determinism(cfg, environ)
    assert environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0" and "CUBLAS_WORKSPACE_CONFIG" in environ
    default_cfg, default_plan = plan_for()
    environ = {}
    assert not settings.apply_determinism(default_cfg, environ) and environ == {}
    assert not settings.transformer_config_kwargs(default_cfg, default_plan, grad_accum_fusion=True)[
        "deterministic_mode"
    ]


def test_p2p_overlap_only_with_interleaving():
    cfg, plan = plan_for("training=llama31/8b", "cluster=bcm")
    kw = settings.transformer_config_kwargs(cfg, plan, grad_accum_fusion=False)
    assert not kw["overlap_p2p_comm"] and kw["batch_p2p_comm"]
    assert kw["cp_comm_type"] == "p2p" and kw["context_parallel_size"] == 2


def test_model_kwargs_use_padded_vocab_and_llama31_rope():
    cfg, plan = plan_for("training=llama31/70b", "cluster=bcm")
    kw = settings.gpt_model_kwargs(cfg, plan)
    assert kw["vocab_size"] == plan.padded_vocab_size == 128512  # 128256 padded to a multiple of 128 * TP4
    assert kw["rotary_base"] == 500000 and kw["rope_scaling"] and kw["rope_scaling_factor"] == 8.0
    assert kw["position_embedding_type"] == "rope" and not kw["share_embeddings_and_output_weights"]


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["training=llama32/1b"], dict(share=True, rope=True, factor=32.0, base=500000)),
        (["training=llama2/70b", "cluster=bcm"], dict(share=False, rope=False, base=10000)),
    ],
)
def test_model_kwargs_follow_the_model_spec(overrides, expect):
    cfg, plan = plan_for(*overrides)
    kw = settings.gpt_model_kwargs(cfg, plan)
    assert kw["share_embeddings_and_output_weights"] == expect["share"] and kw["rope_scaling"] == expect["rope"]
    assert kw["rotary_base"] == expect["base"] and kw["rope_scaling_factor"] == expect.get("factor", 8.0)


def test_transformer_config_follows_the_model_spec():
    import torch.nn.functional as F

    llama = settings.transformer_config_kwargs(*plan_for(), grad_accum_fusion=False)
    assert (llama["normalization"], llama["activation_func"], llama["add_bias_linear"]) == ("RMSNorm", F.silu, False)
    other = settings.transformer_config_kwargs(
        *plan_for(
            "training.model.normalization=layernorm",
            "training.model.activation=geglu",
            "training.model.add_bias_linear=true",
            "training.model.norm_epsilon=1e-6",
        ),
        grad_accum_fusion=False,
    )
    assert (other["normalization"], other["activation_func"], other["add_bias_linear"]) == ("LayerNorm", F.gelu, True)
    assert other["layernorm_epsilon"] == 1e-6 and other["gated_linear_unit"]


def test_the_plan_knows_megatron_cores_fixed_rope_scaling():
    """The values launcher/plan/checks/model.py lets through are the ones megatron-core applies."""
    import inspect

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from launcher.plan.checks.model import MEGATRON_ROPE_SCALING

    defaults = inspect.signature(RotaryEmbedding._apply_scaling).parameters
    assert {key: defaults[key].default for key in MEGATRON_ROPE_SCALING} == MEGATRON_ROPE_SCALING


def test_optimizer_and_schedule():
    cfg, plan = plan_for("training=llama31/405b", "cluster=bcm")
    opt = settings.optimizer_config(cfg, plan)
    assert (opt.lr, opt.min_lr, opt.adam_eps, opt.weight_decay, opt.clip_grad) == (8e-5, 8e-7, 1e-5, 0.1, 1.0)
    assert (opt.adam_beta1, opt.adam_beta2) == (0.9, 0.95) and opt.use_distributed_optimizer
    sched = settings.scheduler_kwargs(cfg)
    assert sched["lr_warmup_steps"] == 8000 and sched["lr_decay_steps"] == 105963
    assert sched["lr_decay_style"] == "cosine" and sched["max_lr"] == 8e-5 and sched["min_lr"] == 8e-7
    tiny_cfg, _ = plan_for()
    assert settings.scheduler_kwargs(tiny_cfg)["lr_decay_steps"] == tiny_cfg.training.train_steps


def test_userbuffer_shape_is_one_cp_shard_of_a_microbatch():
    cfg, plan = plan_for("training=llama31/405b", "cluster=bcm", "dtype=fp8")
    ub = settings.userbuffer_settings(cfg, plan)
    assert ub["shape"] == [8192 // 2, 16384] and ub["tp_size"] == 8 and ub["fp8"]
    assert ub["ub_cfgs"]["proj_fprop"]["fp8_buf"] is True and ub["ub_cfgs"]["qkv_fprop"]["method"] == "ring_exchange"


@pytest.mark.parametrize(
    "layers,pp,vp,asym",
    [(126, 8, 8, True), (126, 8, 2, True), (80, 4, 5, False), (80, 8, 5, False), (6, 2, 2, True), (32, 1, None, False)],
)
def test_plan_layer_split_matches_megatron(layers, pp, vp, asym):
    """The launcher's per-stage layer counts are what megatron-core builds on each pipeline rank."""
    from launcher.plan.formulas import layers_per_pipeline_stage
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config = TransformerConfig(
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        account_for_embedding_in_pipeline_split=asym,
        account_for_loss_in_pipeline_split=asym,
        pipeline_dtype=torch.bfloat16,
    )
    built = [
        sum(get_num_layers_to_build(config, vp_stage=v if vp else None, pp_rank=r) for v in range(vp or 1))
        for r in range(pp)
    ]
    assert layers_per_pipeline_stage(layers, pp, asym) == built
    assert sum(built) == layers


# ----------------------------------------------------------------------------- data
def test_sampler_splits_global_batches_over_dp_and_resumes_exactly():
    full = [list(b) for b in data.sample_indices(0, 64, micro_batch_size=2, dp_rank=1, dp_size=4)]
    assert full[0] == [2, 3] and full[1] == [10, 11]
    # Every sample is seen once across ranks.
    seen = sorted(i for r in range(4) for b in data.sample_indices(0, 64, 2, r, 4) for i in b)
    assert seen == list(range(64))
    resumed = [list(b) for b in data.sample_indices(24, 64, micro_batch_size=2, dp_rank=1, dp_size=4)]
    assert resumed == full[3:]


def test_blend_forms():
    assert data.blend_of([0.3, "/d/a", 0.7, "/d/b"]) == (["/d/a", "/d/b"], [0.3, 0.7])
    assert data.blend_of(["/d/a", "/d/b"]) == (["/d/a", "/d/b"], None)


def test_split_sizes():
    assert data.split_sizes(100, 8, 50, 32) == [800, 32, 0]
    assert data.split_sizes(100, 8, 0, 32) == [800, 0, 0]


def test_mock_tokenizer_for_mock_data():
    cfg, _ = plan_for()
    tok = data.build_tokenizer(cfg)
    assert tok.vocab_size == 128256 and tok.eod == 128001


def test_a_wrong_tokenizer_is_named_by_its_training_key(tmp_path):
    from data_prep.tokenizer import TokenizerError

    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    cfg, _ = plan_for(
        "training.data.mock=false",
        f"training.tokenizer.path={tmp_path}",
        "training.tokenizer.type=huggingface",
        "dry_run=true",
    )
    with pytest.raises(
        TokenizerError,
        match=rf"^training\.tokenizer\.path={tmp_path} is a directory without "
        r"tokenizer\.json; .* set training\.tokenizer\.type=sentencepiece",
    ):
        data.build_tokenizer(cfg)


# ----------------------------------------------------------------------------- stop signals
def _sleeper() -> subprocess.Popen:
    # Popen returns once the child has exec'd, so its signal mask is final when we read it.
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _signal_set(pid: int, field: str) -> set[int]:
    """Signals in a /proc/<pid>/status mask (SigBlk: blocked, ShdPnd: pending for the process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_helpers_started_while_blocked_outlive_stop_signals_and_the_trainer_still_gets_them():
    # Deterministic: no waiting for a process to die or not. What decides survival is the helper's signal mask,
    # read from /proc; a blocked SIGTERM then sits in its pending set for good.
    stops = {int(s) for s in stop_signals.STOP_SIGNALS}
    previous = {sig: signal.getsignal(sig) for sig in stop_signals.STOP_SIGNALS}
    ordinary = _sleeper()
    helper = None
    try:
        stop = stop_signals.StopSignal()
        assert not stops & _signal_set(ordinary.pid, "SigBlk")
        ordinary.send_signal(signal.SIGTERM)
        assert ordinary.wait() == -signal.SIGTERM  # an ordinary child dies of it

        with stop_signals.helpers_immune_to_stop_signals():
            helper = _sleeper()
            # Directed at this thread, which blocks it (a signal sent to the whole process may be taken by
            # another thread, e.g. one a library started, and handled at once).
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            assert stop.received is None  # held while helpers start
        assert stop.received == signal.SIGUSR1  # delivered once the block ends

        assert stops <= _signal_set(helper.pid, "SigBlk")
        helper.send_signal(signal.SIGTERM)
        assert int(signal.SIGTERM) in _signal_set(helper.pid, "ShdPnd")  # pending, never delivered
        assert helper.poll() is None
    finally:
        for proc in (ordinary, helper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_spawned_multiprocessing_manager_started_while_blocked_survives_sigterm():
    # What an async checkpoint save starts: a spawn-context Manager, whose start also starts the resource
    # tracker (which unblocks SIGTERM in its caller). A fresh interpreter, so neither is running yet.
    script = """
import multiprocessing, os, signal
from recipes.runtime.stop_signals import helpers_immune_to_stop_signals
before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
with helpers_immune_to_stop_signals():
    manager = multiprocessing.get_context("spawn").Manager()
    queue = manager.Queue()
assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
status = open(f"/proc/{manager._process.pid}/status").read()
blocked = int(status.split("SigBlk:")[1].split()[0], 16)
assert blocked >> (signal.SIGTERM - 1) & 1, "the manager does not block SIGTERM"
os.kill(manager._process.pid, signal.SIGTERM)  # blocked: stays pending, the manager keeps serving
queue.put("alive")
print(queue.get(timeout=5))
manager.shutdown()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "alive", result.stderr[-2000:]


# ----------------------------------------------------------------------------- ranks
def test_rank_info_from_torchrun_then_slurm():
    assert astuple(
        rank_info({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "n1", "MASTER_PORT": "6000"})
    ) == (3, 1, 8, "n1", 6000)
    assert astuple(
        rank_info(
            {
                "SLURM_PROCID": "9",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS": "16",
                "MASTER_ADDR": "n0",
                "MASTER_PORT": "7000",
            }
        )
    )[:3] == (9, 1, 16)
    assert astuple(rank_info({}))[:3] == (0, 0, 1)


# ----------------------------------------------------------------------------- checkpoints
def _fake_save(root, step, consumed):
    os.makedirs(checkpoints.partial_path(root, step))
    with open(os.path.join(checkpoints.partial_path(root, step), "shard"), "w") as f:
        f.write("x")
    return checkpoints.finalize_checkpoint(root, checkpoints.TrainState(step=step, consumed_samples=consumed))


def test_only_finalized_checkpoints_count(tmp_path):
    root = str(tmp_path)
    _fake_save(root, 100, 800)
    os.makedirs(checkpoints.partial_path(root, 200))  # a save killed midway
    os.makedirs(os.path.join(root, "iter_0000300"))  # a directory without the state file
    assert checkpoints.latest_checkpoint(root)[0] == 100
    state = checkpoints.read_train_state(checkpoints.latest_checkpoint(root)[1])
    assert (state.step, state.consumed_samples) == (100, 800)
    assert open(os.path.join(root, checkpoints.TRACKER)).read().strip() == "100"
    assert checkpoints.remove_partials(root) == [".partial_iter_0000200"]


def test_prune_keeps_the_newest(tmp_path):
    root = str(tmp_path)
    for step in (10, 20, 30, 40):
        _fake_save(root, step, step * 8)
    removed = checkpoints.prune_checkpoints(root, keep_last=2)
    assert [os.path.basename(p) for p in removed] == ["iter_0000010", "iter_0000020"]
    assert [s for s, _ in checkpoints.complete_checkpoints(root)] == [30, 40]
    assert checkpoints.prune_checkpoints(root, keep_last=0) == []


def test_resaving_a_step_replaces_it(tmp_path):
    root = str(tmp_path)
    _fake_save(root, 50, 400)
    _fake_save(root, 50, 400)
    assert [s for s, _ in checkpoints.complete_checkpoints(root)] == [50]


# ----------------------------------------------------------------------------- metrics
def test_metrics_match_reference_formulas():
    _, plan = plan_for("training=llama31/70b", "dtype=fp8", "cluster=bcm")
    m = metrics.step_metrics(plan, step=10, loss=2.5, lr=1e-4, grad_norm=1.0, step_time_s=11.31, consumed_samples=1280)
    assert round(m.tokens_per_s) == 92712
    assert round(m.mfu * 100, 1) == 35.2 and m.mfu_peak_flops == 1979e12
    line = metrics.progress_line(m, 50)
    for field in (
        "reduced_train_loss=2.5000",
        "global_step=10",
        "consumed_samples=1280",
        "train_step_timing in s=11.3100",
    ):
        assert field in line


def test_the_metrics_file_drops_records_past_the_resume_point(tmp_path):
    _, plan = plan_for()
    path = str(tmp_path / "metrics.jsonl")
    writer = metrics.MetricsFile(path)
    writer.training_starts(TrainState(step=0, consumed_samples=0))
    for step in range(1, 6):
        writer.logged(
            metrics.step_metrics(
                plan, step=step, loss=1.0, lr=0.1, grad_norm=1.0, step_time_s=0.1, consumed_samples=step * 8
            )
        )
    writer.stops(Stop(FINISHED, 5, 40))
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # a line cut by a crash
    resumed = metrics.MetricsFile(path)
    resumed.training_starts(TrainState(step=3, consumed_samples=24))
    resumed.stops(Stop(ERROR, 3, 24))
    steps = [json.loads(line)["step"] for line in open(path)]
    assert steps == [1, 2, 3]
    record = json.loads(open(path).readline())
    assert {
        "step",
        "loss",
        "lr",
        "grad_norm",
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "mfu",
        "mfu_peak_flops",
    } <= set(record)


# ----------------------------------------------------------------------------- Hugging Face mapping
def _random_hf_state(model):
    h, ffn, heads, groups, d = (
        model.hidden_size,
        model.ffn_hidden_size,
        model.num_attention_heads,
        model.num_query_groups,
        model.kv_channels,
    )
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    state = {
        "model.embed_tokens.weight": r(model.vocab_size, h),
        "model.norm.weight": r(h),
        "lm_head.weight": r(model.vocab_size, h),
    }
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        state.update(
            {
                p + "input_layernorm.weight": r(h),
                p + "self_attn.q_proj.weight": r(heads * d, h),
                p + "self_attn.k_proj.weight": r(groups * d, h),
                p + "self_attn.v_proj.weight": r(groups * d, h),
                p + "self_attn.o_proj.weight": r(h, heads * d),
                p + "post_attention_layernorm.weight": r(h),
                p + "mlp.gate_proj.weight": r(ffn, h),
                p + "mlp.up_proj.weight": r(ffn, h),
                p + "mlp.down_proj.weight": r(h, ffn),
            }
        )
    return state


def test_hf_mapping_round_trips_and_packs_qkv_per_group():
    cfg, plan = plan_for()
    model = replace(cfg.training.model, vocab_size=1000, num_layers=2)
    hf_state = _random_hf_state(model)
    mc = mapping.hf_to_megatron(hf_state, model, padded_vocab_size=1024)
    assert mc["embedding.word_embeddings.weight"].shape[0] == 1024
    # Padding rows are copies of the last vocabulary row (what Megatron-LM's converters write).
    assert torch.equal(mc["output_layer.weight"][1000:], hf_state["lm_head.weight"][-1:].expand(24, -1))
    qkv = mc["decoder.layers.1.self_attention.linear_qkv.weight"]
    d, per_group = model.kv_channels, model.num_attention_heads // model.num_query_groups
    # Group 1 starts with its query heads, then its key head, then its value head.
    start = (per_group + 2) * d
    q = hf_state["model.layers.1.self_attn.q_proj.weight"]
    k = hf_state["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(qkv[start : start + d], q[per_group * d : per_group * d + d])
    assert torch.equal(qkv[start + per_group * d : start + per_group * d + d], k[d : 2 * d])
    back = mapping.megatron_to_hf(mc, model)
    assert back.keys() == hf_state.keys()
    for key in hf_state:
        assert torch.equal(back[key], hf_state[key]), key


# ----------------------------------------------------------------------------- apex stand-in
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wgrad_fallback_accumulates_the_weight_gradient(dtype):
    from recipes.trainer import wgrad_fallback

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 32, generator=g).to(torch.bfloat16)  # [seq, batch, in]
    dy = torch.randn(2, 16, 8, generator=g).to(torch.bfloat16)  # [seq, batch, out]
    start = torch.randn(8, 32, generator=g).to(dtype)
    main_grad = start.clone()
    accumulate = (
        wgrad_fallback.wgrad_gemm_accum_fp32 if dtype == torch.float32 else wgrad_fallback.wgrad_gemm_accum_fp16
    )
    accumulate(x, dy, main_grad)
    expected = start.double() + dy.reshape(-1, 8).double().t() @ x.reshape(-1, 32).double()
    error = (main_grad.double() - expected).norm() / expected.norm()
    assert error < (1e-6 if dtype == torch.float32 else 1e-2)
    assert main_grad.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wgrad_fallback_drained_by_megatron_keeps_no_output_gradient_alive(dtype, monkeypatch):
    # megatron's pipeline schedules drain the output layer's deferred weight gradients after the last backward,
    # with grad mode on and inputs that still require grad (the final norm's output). The stand-in must record no
    # autograd history there, as apex's kernel records none: a graph on the DDP gradient buffer kept every drained
    # output gradient alive (17.7 GiB a step on the 70B proxy's last stage, PP2, until it ran out of memory).
    import types
    import weakref

    from megatron.core.utils import drain_embedding_wgrad_compute

    from recipes.trainer import wgrad_fallback

    stand_in = types.ModuleType("fused_weight_gradient_mlp_cuda")
    vars(stand_in).update(
        wgrad_gemm_accum_fp32=wgrad_fallback.wgrad_gemm_accum_fp32,
        wgrad_gemm_accum_fp16=wgrad_fallback.wgrad_gemm_accum_fp16,
    )
    monkeypatch.setitem(sys.modules, "fused_weight_gradient_mlp_cuda", stand_in)
    g = torch.Generator().manual_seed(2)
    norm = torch.nn.Linear(32, 32)  # stands in for the final norm: its output requires grad
    buffer = torch.zeros(8 * 32 + 5, dtype=dtype)  # the DDP gradient buffer; main_grad is a view of it
    weight = torch.nn.Parameter(torch.zeros(8, 32, dtype=torch.bfloat16))
    weight.main_grad = buffer[: 8 * 32].view(8, 32)
    config = types.SimpleNamespace(sequence_parallel=False, gradient_accumulation_fusion=True)
    tp_group = types.SimpleNamespace(size=lambda: 1)
    expected = torch.zeros(8, 32, dtype=torch.float64)
    alive = []
    for _ in range(3):  # steps: the DDP buffer is zeroed, then each step drains its microbatches
        buffer.zero_()
        expected.zero_()
        activations = [norm(torch.randn(2, 16, 32, generator=g)).to(torch.bfloat16) for _ in range(4)]
        grads = [torch.randn(2, 16, 8, generator=g).to(torch.bfloat16) for _ in range(4)]
        for x, dy in zip(activations, grads):
            expected += dy.reshape(-1, 8).double().t() @ x.detach().reshape(-1, 32).double()
        alive += [weakref.ref(dy) for dy in grads]
        assert all(x.requires_grad for x in activations)
        drain_embedding_wgrad_compute(config, activations, grads, weight, tp_group)
        assert not activations and not grads
        del x, dy
    still_alive = sum(ref() is not None for ref in alive)
    assert still_alive == 0, f"{still_alive} of {len(alive)} drained output gradients are still referenced"
    assert buffer.grad_fn is None and not weight.main_grad.requires_grad, "the gradient buffer carries a graph"
    error = (weight.main_grad.double() - expected).norm() / expected.norm()
    assert error < (1e-6 if dtype == torch.float32 else 1e-2)


def test_wgrad_fallback_installed_after_megatron_was_imported_still_reaches_its_layers():
    # A fresh interpreter: megatron's layers find no apex at import; installing afterwards must still give them
    # the stand-in (a test process that built a megatron model before training code ran does this).
    script = """
import megatron.core.tensor_parallel.layers as layers
assert not layers._grad_accum_fusion_available
from recipes.trainer import wgrad_fallback
assert wgrad_fallback.install()
assert layers._grad_accum_fusion_available
assert layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 is wgrad_fallback.wgrad_gemm_accum_fp32
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


def test_a_rank_under_torchrun_dies_with_its_agent():
    # The agent starts the rank in a session of its own, as torchrun does, then is killed hard: the rank must not
    # outlive it. The check polls for an event the kernel makes immediate; the deadline only bounds a failure.
    agent = """
import os, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "from recipes.runtime.ranks import die_with_torchrun; "
                         "import sys, time; "
                         "sys.exit(3) if not die_with_torchrun() else print('armed', flush=True); time.sleep(600)"],
                        env={**os.environ, "TORCHELASTIC_RUN_ID": "test"}, start_new_session=True,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
assert rank.stdout.readline().strip() == "armed"
print(rank.pid, flush=True)
os.kill(os.getpid(), 9)
"""
    result = subprocess.run([sys.executable, "-c", agent], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    rank_pid = int(result.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{rank_pid}").exists() and "Z" not in _state(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{rank_pid}").exists() or "Z" in _state(rank_pid), "the rank outlived its agent"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_the_training_entry_imports_neither_torch_nor_megatron_before_its_stack_check():
    # What `python -m recipes.train` has loaded once its module ran: the trainer (torch, megatron-core at the top
    # of its modules) is imported by main() only after the check.
    script = (
        "import sys, recipes.train; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'megatron', 'transformer_engine', 'recipes')))"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(
        ["recipes", "recipes.entry", "recipes.runtime", "recipes.runtime.ranks", "recipes.train"]
    )


def test_ranks_started_otherwise_are_left_alone():
    from recipes.runtime.ranks import die_with_torchrun

    assert die_with_torchrun({"SLURM_PROCID": "0"}) is False
