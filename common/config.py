"""The typed run config: one dataclass per config group, the one definition both sides read. On the host Hydra
composes the YAML files of conf/ into it (launcher/config/schema.py registers these classes in its ConfigStore, so
`training.seq_length=abc` or a string where a list belongs is refused while composing); the resolved config is
then built into these objects (`load_config`), and on the GPU side a run directory's config.yaml is read into
them the same way (common/run.py). This module declares every key's type, range and one-line meaning; the values
and defaults live in conf/. Rules between keys are the plan's checks (launcher/plan/checks/). No Hydra, OmegaConf
or torch here: the ranks import it.

A group whose options carry different keys (cluster: one per platform; data_preparation: one per source; peft: one
per method) has a base class and one subclass per option; the option's YAML names its subclass in its defaults
list, e.g. `- /schema/cluster/slurm@_here_`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
import math
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

from common.typed import StrEnum, Variants, from_plain

# OmegaConf's mark of a value the YAML must set (its MISSING), without importing OmegaConf.
MISSING = "???"


class Range(NamedTuple):
    """The values a numeric key takes: from `low` to `high` (None: no bound that way), each end included unless
    open. `why` explains a bound that is not obvious from the key's doc."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):  # nan passes no comparison; inf is no size, count or rate
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def words(self) -> str:
        """`positive`, `at least 10`, `from 0 to 1`, `in [0, 1)`: what `must be ...` says."""
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            if self.low == 0 and self.low_open or self.low == 1 and not self.low_open:
                return "positive"
            return f"above {low}" if self.low_open else f"at least {low}"
        if self.low is None:
            return f"below {high}" if self.high_open else f"at most {high}"
        if not (self.low_open or self.high_open):
            return f"from {low} to {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


COUNT = Range(1)  # sizes, counts, steps, intervals: an integer of 1 or more
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)  # a real quantity above 0 (rates, epsilons, seconds)
SHARE = Range(0, 1)
SHARE_ABOVE_0 = Range(0, 1, low_open=True)
SHARE_BELOW_1 = Range(0, 1, high_open=True)
BETA = Range(0, 1, high_open=True)  # AdamW's betas
PORT = Range(1, 65535)
SEED = Range(0, 2**32 - 1, why="numpy's and torch's generators take seeds below 2**32")
CHUNK_BYTES = Range(4096, 2**30)
# ft_launcher's rank monitors look at the ranks every 5 s (its workload_check_interval): a shorter timeout could not
# be kept.
TIMEOUT = Range(10, why="seconds; ft_launcher looks at the ranks every 5 s")


def key(doc: str, default: Any = MISSING, within: Range | None = None) -> Any:
    """A key whose value the YAML sets (or `default` where the schema itself provides one), with its one-line doc;
    a numeric key also declares the values it takes (`within`), which the plan checks before anything else
    (launcher/plan/checks/ranges.py)."""
    metadata = {"doc": doc, **({"range": within} if within else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def range_of(f: Any) -> Range | None:
    """The values a schema field (dataclasses.Field) takes, or None for a key that is not numeric."""
    return f.metadata.get("range")


def group(kind: type, doc: str) -> Any:
    """A nested section of keys."""
    return field(default_factory=kind, metadata={"doc": doc})


def doc_of(owner: type, name: str) -> str:
    for f in fields(owner):
        if f.name == name:
            return f.metadata.get("doc", "")
    raise KeyError(name)


# --------------------------------------------------------------------------- closed sets of values
class Stage(StrEnum):
    """Stages, in the order they run; `stages=[...]` picks a subset."""

    container = "container"
    data_preparation = "data_preparation"
    preflight = "preflight"
    training = "training"
    export = "export"
    evaluation = "evaluation"


class PlatformName(StrEnum):
    local = "local"
    slurm = "slurm"
    sge = "sge"
    bcp = "bcp"
    k8s = "k8s"


class ContainerRuntime(StrEnum):
    pyxis = "pyxis"
    apptainer = "apptainer"
    none = "none"


class TokenizerType(StrEnum):
    huggingface = "huggingface"
    sentencepiece = "sentencepiece"


class Normalization(StrEnum):
    rmsnorm = "rmsnorm"
    layernorm = "layernorm"


class Activation(StrEnum):
    """The gated MLP's activation: act(x W_gate) * (x W_up)."""

    swiglu = "swiglu"
    geglu = "geglu"


class RopeScalingType(StrEnum):
    llama3 = "llama3"


class AttentionBackend(StrEnum):
    auto = "auto"
    fused = "fused"
    flash = "flash"
    unfused = "unfused"


class Fp8Format(StrEnum):
    hybrid = "hybrid"
    e4m3 = "e4m3"


class Fp8Recipe(StrEnum):
    delayed = "delayed"
    tensorwise = "tensorwise"
    blockwise = "blockwise"
    mxfp8 = "mxfp8"


class Fp4Format(StrEnum):
    nvfp4 = "nvfp4"


class CrossEntropyFusion(StrEnum):
    native = "native"
    te = "te"
    none = "none"


class CudaGraphs(StrEnum):
    none = "none"
    per_layer = "per_layer"
    full_iteration = "full_iteration"


class RankOrder(StrEnum):
    pp_last = "pp_last"
    dp_last = "dp_last"


class Recompute(StrEnum):
    selective = "selective"
    full = "full"


class RecomputeMethod(StrEnum):
    uniform = "uniform"
    block = "block"


class ProfileTool(StrEnum):
    torch = "torch"
    nsys = "nsys"


class WandbMode(StrEnum):
    auto = "auto"
    online = "online"
    offline = "offline"


class FaultKind(StrEnum):
    hang = "hang"
    crash = "crash"
    kill = "kill"
    enospc = "enospc"


class FaultPoint(StrEnum):
    step = "step"
    save = "save"


class InputFormat(StrEnum):
    auto = "auto"
    jsonl = "jsonl"
    text = "text"


class DataFormat(StrEnum):
    pretrain = "pretrain"
    sft = "sft"


class TextDocument(StrEnum):
    line = "line"
    file = "file"


class PeftMethod(StrEnum):
    none = "none"
    lora = "lora"


class LoraTarget(StrEnum):
    """The decoder layer's linear layers an adapter can attach to (megatron-core's names)."""

    linear_qkv = "linear_qkv"
    linear_proj = "linear_proj"
    linear_fc1 = "linear_fc1"
    linear_fc2 = "linear_fc2"

    @property
    def column_parallel(self) -> bool:
        """megatron-core shards this layer's output over TP (column-parallel); else its input (row-parallel)."""
        return self in (LoraTarget.linear_qkv, LoraTarget.linear_fc1)


class LoraInit(StrEnum):
    kaiming_uniform = "kaiming_uniform"
    zero = "zero"


# --------------------------------------------------------------------------- training
@dataclass
class RopeScaling:
    type: RopeScalingType = key(
        "llama3: Llama 3's frequency scaling (Hugging Face rope_scaling.rope_type); training.model.rope_scaling=null: "
        "none (Llama 2)"
    )
    factor: float = key("long wavelengths are divided by this (Llama 3.1: 8, Llama 3.2: 32)", within=POSITIVE)
    low_freq_factor: float = key("wavelengths above original / this are scaled whole", within=POSITIVE)
    high_freq_factor: float = key("wavelengths below original / this are kept", within=POSITIVE)
    original_max_position_embeddings: int = key("context length the model was first trained at", within=COUNT)


@dataclass
class ModelConfig:
    """The architecture: everything the plan, the trainer and the Hugging Face mapping read of a model. A family's
    facts live in conf/training/<family>/_common.yaml, a size's in conf/training/<family>/<size>.yaml."""

    num_layers: int = key("decoder layers", within=COUNT)
    hidden_size: int = key("hidden size", within=COUNT)
    ffn_hidden_size: int = key("gated MLP width", within=COUNT)
    num_attention_heads: int = key("query heads", within=COUNT)
    num_query_groups: int = key("key/value heads (grouped-query attention)", within=COUNT)
    kv_channels: int = key("size of one attention head", within=COUNT)
    vocab_size: int = key(
        "tokenizer vocabulary; megatron pads it for TP (make_vocab_size_divisible_by x tp)", within=COUNT
    )
    make_vocab_size_divisible_by: int = key("the padded vocabulary is a multiple of this x tp", within=COUNT)
    normalization: Normalization = key("rmsnorm (Llama) or layernorm (with biases)")
    norm_epsilon: float = key("epsilon of every norm", within=POSITIVE)
    activation: Activation = key("the gated MLP's activation: swiglu (SiLU, Llama) or geglu (GELU)")
    add_bias_linear: bool = key("every linear layer has a bias (Hugging Face attention_bias and mlp_bias)")
    share_embeddings_and_output_weights: bool = key(
        "tied embeddings: the output layer is the input embedding (Llama 3.2 1B/3B); false: two matrices"
    )
    rotary_base: int = key("RoPE base frequency (rope_theta)", within=COUNT)
    rope_scaling: Optional[RopeScaling] = key("RoPE frequency scaling (Llama 3); null: none (Llama 2)")
    max_position_embeddings: int = key("context length an exported config.json declares", within=COUNT)
    attention_backend: AttentionBackend = key("Transformer Engine attention backend: auto, fused, flash or unfused")
    init_method_std: float = key("standard deviation of the random weight initialisation", within=POSITIVE)
    cross_entropy_fusion: Optional[CrossEntropyFusion] = key(
        "fused loss kernel: native (megatron-core's), te (Transformer Engine's) or none (unfused); null: te with one "
        "tensor-parallel rank or in deterministic runs, native otherwise (plan.json cross_entropy_fusion)"
    )
    from_hf: bool = key(
        "take the architecture from training.checkpoint.init_from_hf's config.json instead of these keys"
    )


@dataclass
class OptimizerConfig:
    lr: float = key("peak learning rate (AdamW)", within=POSITIVE)
    min_lr: float = key("learning rate at the end of the cosine decay", within=NON_NEGATIVE)
    weight_decay: float = key("AdamW weight decay", within=NON_NEGATIVE)
    adam_beta1: float = key("AdamW beta1", within=BETA)
    adam_beta2: float = key("AdamW beta2", within=BETA)
    adam_eps: float = key("AdamW epsilon", within=POSITIVE)
    clip_grad: float = key("global gradient-norm clipping (0: none)", within=NON_NEGATIVE)


@dataclass
class SchedulerConfig:
    warmup_steps: int = key("linear warmup steps", within=NON_NEGATIVE)
    decay_steps: Optional[int] = key("cosine decay horizon in steps; null: train_steps", within=COUNT)


@dataclass
class DataConfig:
    mock: bool = key("megatron's synthetic data (benchmarks); false reads blend")
    blend: Optional[List[Any]] = key("[weight, prefix, weight, prefix, ...] or [prefix, ...] from data preparation")
    split: str = key('train,validation,test shares of blend, e.g. "99,1,0"')
    valid_blend: Optional[List[str]] = key(
        "a separate validation set [prefix, ...], read in order; null: the validation share of split"
    )
    num_workers: int = key("data-loader worker processes per rank", within=NON_NEGATIVE)
    format: DataFormat = key(
        "pretrain (a token stream cut into sequences) or sft (samples with loss masks: sft_jsonl, govreport_mlperf)"
    )
    packing: bool = key("sft: several samples per sequence, each attending only to itself; false: one padded sample")
    truncate: bool = key("sft: cut samples longer than seq_length; false: refuse them, naming the sample")


@dataclass
class TokenizerConfig:
    type: TokenizerType = key(
        "huggingface (hub id, directory with tokenizer.json, or the file) or sentencepiece (.model file)"
    )
    path: str = key("hub id, tokenizer directory or file")


@dataclass
class CheckpointConfig:
    interval: int = key("save every N steps (0: only on a stop signal and at the end)", within=NON_NEGATIVE)
    save_at_end: bool = key("save when training ends")
    keep_last: int = key("complete checkpoints kept; older ones are deleted", within=NON_NEGATIVE)
    async_save: bool = key("write checkpoints in the background while training goes on")
    load: bool = key("resume from this run's newest complete checkpoint")
    init_from: Optional[str] = key("a checkpoint directory whose weights start a run without checkpoints of its own")
    init_from_hf: Optional[str] = key(
        "Hugging Face Llama weights (directory or hub id) that start a run without checkpoints of its own"
    )
    export_dir: Optional[str] = key("where the export stage writes Hugging Face weights; null: RUN_DIR/hf")
    export_max_shard_size: str = key("largest safetensors shard of an export, e.g. 5GB")
    save_initial: bool = key("also save the freshly initialised model as iter_0000000")


@dataclass
class DefaultLayout:
    """The layout (conf/parallelism/<name>.yaml) a run of this model gets unless parallelism=<name> picks one."""

    bf16: Optional[str] = key("the layout of bf16 runs (conf/parallelism/<name>.yaml); null: parallelism=<name> picks")
    fp8: Optional[str] = key("of FP8 runs; null: bf16's")
    nvfp4: Optional[str] = key("of NVFP4 runs; null: fp8's")

    def for_dtype(self, dtype: DtypeConfig) -> str | None:
        if dtype.fp4:
            return self.nvfp4 or self.fp8 or self.bf16
        return (self.fp8 or self.bf16) if dtype.fp8 else self.bf16


@dataclass
class TrainingConfig:
    name: str = key("model name in run names and reports")
    model: ModelConfig = group(ModelConfig, "architecture")
    default_layout: DefaultLayout = group(DefaultLayout, "the layout unless parallelism=<name> picks one")
    seq_length: int = key("tokens per sequence", within=COUNT)
    micro_batch_size: int = key("sequences per microbatch on one data-parallel rank", within=COUNT)
    global_batch_size: int = key("sequences per optimizer step", within=COUNT)
    train_steps: int = key("optimizer steps to train", within=COUNT)
    val_interval: int = key("validate every N steps (0: never)", within=NON_NEGATIVE)
    val_steps: int = key("global batches per validation", within=COUNT)
    val_samples: Optional[int] = key("sequences per validation instead of val_steps batches (MLPerf)", within=COUNT)
    val_skip: int = key(
        "the first N evaluations of the val_interval cadence do not run (MLPerf Llama 2 70B LoRA)", within=NON_NEGATIVE
    )
    target_val_loss: Optional[float] = key(
        "stop once the validation loss reaches this; null: train every step", within=POSITIVE
    )
    log_interval: int = key("log every N steps", within=COUNT)
    deterministic: bool = key("bitwise-reproducible kernels and reductions (somewhat slower)")
    cuda_graphs: CudaGraphs = key(
        "CUDA graphs of training steps: none, per_layer (each decoder layer's forward and "
        "backward) or full_iteration (forward and backward of every microbatch)"
    )
    cuda_graph_warmup_steps: int = key(
        "training steps run eagerly in each process before the graphs are captured", within=NON_NEGATIVE
    )
    optimizer: OptimizerConfig = group(OptimizerConfig, "AdamW")
    scheduler: SchedulerConfig = group(SchedulerConfig, "learning-rate schedule: linear warmup, cosine decay")
    data: DataConfig = group(DataConfig, "training data")
    tokenizer: TokenizerConfig = group(TokenizerConfig, "tokenizer of the training data")
    checkpoint: CheckpointConfig = group(CheckpointConfig, "checkpoints, initial weights, export")


# --------------------------------------------------------------------------- fine-tuning, one class per method
@dataclass
class PeftConfig:
    method: PeftMethod = key("none (every weight trains) or lora (a frozen base with trained low-rank adapters)")


@dataclass
class LoraConfig(PeftConfig):
    rank: int = key("r: the inner size of each adapter (A is r x in, B is out x r)", within=COUNT)
    alpha: float = key("the adapters' output is scaled by alpha / rank", within=POSITIVE)
    dropout: float = key("dropout on the adapters' input while training (0: none)", within=SHARE_BELOW_1)
    target_modules: List[LoraTarget] = key(
        "the linear layers of every decoder layer that get an adapter: linear_qkv, linear_proj, linear_fc1, linear_fc2"
    )
    a_init: LoraInit = key(
        "initialisation of A: kaiming_uniform (as Hugging Face PEFT and NVIDIA's MLPerf LoRA) or zero"
    )
    b_init: LoraInit = key("initialisation of B: zero (the adapted model starts as the base) or kaiming_uniform")
    random_base: bool = key(
        "true: the frozen base may be random weights when no base is given (speed benchmarks, not fine-tuning)",
        default=False,
    )


# --------------------------------------------------------------------------- precision
@dataclass
class DtypeConfig:
    name: str = key("bf16, fp8, nvfp4 or fp32, in run names")
    bf16: bool = key(
        "bf16 weights, activations and matmuls (fp32 master weights in the optimizer); false (dtype=fp32): fp32 "
        "throughout, for numerics checks against a reference (slower; no FP8 or FP4)"
    )
    fp8: Optional[Fp8Format] = key("FP8 format: hybrid (E4M3 forward, E5M2 backward) or e4m3; null: bf16 only")
    fp8_recipe: Optional[Fp8Recipe] = key(
        "FP8 scaling: delayed (amax history), tensorwise (current scaling), "
        "blockwise (1x128 / 128x128 blocks) or mxfp8 (Blackwell)"
    )
    fp4: Optional[Fp4Format] = key("FP4 linear layers: nvfp4 (Blackwell; instead of dtype.fp8); null: none")
    fp8_param_gather: Optional[bool] = key(
        "FP8 weights, gathered in FP8 by the distributed optimizer; null: on where "
        "it shards over 8 or more data-parallel x context-parallel ranks or bf16 "
        "weights would not fit, off otherwise (plan.json fp8_param_gather)"
    )
    fp8_amax_history_len: int = key("delayed scaling: amax history length", within=COUNT)
    fp8_amax_compute_algo: str = key("delayed scaling: max or most_recent")
    fp8_margin: int = key("FP8 scaling margin (powers of two)", within=NON_NEGATIVE)
    fp8_dot_product_attention: Optional[bool] = key(
        "attention in FP8 (cuDNN); null: on with delayed scaling where the GPU's FP8 attention trains the head size, "
        "off otherwise (plan.json fp8_dot_product_attention)"
    )
    fp8_output_layer: bool = key("the output layer's GEMM in FP8 (megatron-core offers it with mxfp8 only)")
    te_op_fuser: bool = key(
        "the MLP as Transformer Engine fused ops: SwiGLU writes FP8 for fc2, its backward "
        "FP8 gradients for fc1 (weights cast every microbatch unless in FP8)"
    )
    te_activation_func: bool = key("Transformer Engine's SwiGLU kernel instead of megatron-core's fused one")
    userbuffers_fp8_buf: bool = key("userbuffer reduce-scatter outputs of proj/fc2 in FP8")


# --------------------------------------------------------------------------- parallelism
@dataclass
class SearchSpace:
    tp: List[int] = key("tensor-parallel sizes tried", within=COUNT)
    pp: List[int] = key("pipeline-parallel sizes tried", within=COUNT)
    cp: List[int] = key("context-parallel sizes tried", within=COUNT)
    vp: List[Optional[int]] = key("virtual pipeline sizes tried (null: none)", within=COUNT)
    micro_batch_size: List[int] = key("micro batch sizes tried", within=COUNT)
    recompute: List[Optional[Recompute]] = key("recomputation tried: null or full")
    asymmetric_pipeline: List[bool] = key("asymmetric pipeline split tried")


@dataclass
class UserbufferPreset:
    tp: int = key("tensor-parallel size the preset is for", within=COUNT)
    preset: str = key("conf/userbuffers/ file")


@dataclass
class TunedSize:
    hidden_size: int = key("hidden size these settings apply to", within=COUNT)
    wgrad_deferral_limit: int = key("embedding weight-gradient GEMMs deferred with PP", within=NON_NEGATIVE)
    userbuffers: List[UserbufferPreset] = key("userbuffer preset per TP size")


@dataclass
class ByDtype:
    bf16: float = key("for bf16", within=SHARE_ABOVE_0)
    fp8: float = key("for fp8", within=SHARE_ABOVE_0)


@dataclass
class Exposed:
    overlap: float = key("with overlap", within=SHARE)
    no_overlap: float = key("without overlap", within=SHARE)


@dataclass
class ElementwiseBytes:
    hidden: int = key("bytes per token and layer per hidden unit", within=NON_NEGATIVE)
    ffn: int = key("bytes per token and layer per FFN unit", within=NON_NEGATIVE)


@dataclass
class GpuBandwidth:
    hbm_gb_s: float = key("HBM bandwidth, GB/s", within=POSITIVE)
    nvlink_gb_s: float = key("NVLink bandwidth per GPU and direction, GB/s", within=POSITIVE)
    network_gb_s: float = key("network bandwidth per GPU and direction, GB/s", within=POSITIVE)


@dataclass
class StepTimeConstants:
    gemm_efficiency: ByDtype = group(ByDtype, "share of the dtype's dense peak a large GEMM reaches")
    gemm_half_dim: int = key("GEMM efficiency x d / (d + this), d the narrowest dimension", within=NON_NEGATIVE)
    attention_efficiency: float = key("causal attention core as a share of the bf16 peak", within=SHARE_ABOVE_0)
    cp_attention_penalty: float = key("attention slower per token by this x log2(cp)", within=NON_NEGATIVE)
    fp8_attention_speedup: float = key(
        "the attention core this many times faster with FP8 attention (plan.json fp8_dot_product_attention)",
        within=POSITIVE,
    )
    elementwise_bytes: ElementwiseBytes = group(ElementwiseBytes, "elementwise kernels' memory traffic")
    memory_efficiency: float = key("share of HBM bandwidth elementwise kernels reach", within=SHARE_ABOVE_0)
    fp8_elementwise_factor: float = key("elementwise traffic factor with FP8 casts", within=POSITIVE)
    loss_bytes_per_logit: int = key("fused cross entropy's bytes per logit", within=NON_NEGATIVE)
    link_efficiency: float = key("share of link bandwidth collectives reach", within=SHARE_ABOVE_0)
    tp_collectives_per_layer: int = key(
        "TP all-gathers/reduce-scatters per layer, forward + backward", within=NON_NEGATIVE
    )
    tp_exposed: Exposed = group(Exposed, "share of TP communication left exposed")
    tp_overlap_gemm_slowdown: float = key("GEMMs slowed by the SMs userbuffer overlap takes", within=NON_NEGATIVE)
    tp_ring_step_s: float = key("fixed cost of each TP ring step, seconds", within=NON_NEGATIVE)
    cp_exposed: float = key("share of CP's KV exchange left exposed", within=SHARE)
    pp_exposed: Exposed = group(Exposed, "share of pipeline sends left exposed")
    dp_exposed_min: float = key("least share of data-parallel communication exposed", within=SHARE)
    optimizer_bytes_per_param: int = key("distributed optimizer bytes per parameter of the shard", within=NON_NEGATIVE)
    step_overhead_s: float = key("fixed cost per step, seconds", within=NON_NEGATIVE)
    microbatch_overhead_s: float = key("fixed cost per microbatch and chunk, seconds", within=NON_NEGATIVE)
    gpus: Dict[str, GpuBandwidth] = key("bandwidths per cluster.gpu_type")


@dataclass
class AutoConfig:
    pick: int = key("which ranked layout becomes the run's (0: the fastest predicted)", within=NON_NEGATIVE)
    top: int = key("rows of the printed ranking", within=COUNT)
    memory_headroom: float = key("share of GPU memory a layout must leave free", within=SHARE_BELOW_1)
    search: SearchSpace = group(SearchSpace, "every combination is tried")
    tuned: List[TunedSize] = key("per hidden size: NVIDIA's tuned settings every layout found gets")
    step_time: StepTimeConstants = group(StepTimeConstants, "the step-time model's constants")


@dataclass
class ParallelismConfig:
    name: str = key("layout name, in run names")
    num_gpus: int = key("GPUs of the job; DP = num_gpus / (tp x pp x cp)", within=COUNT)
    tp: int = key("tensor-parallel size", within=COUNT)
    pp: int = key("pipeline-parallel size", within=COUNT)
    cp: int = key("context-parallel size", within=COUNT)
    vp: Optional[int] = key("virtual pipeline stages per PP rank (interleaved schedule); null: none", within=COUNT)
    sequence_parallel: bool = key("shard norms and dropout over TP (needs tp > 1)")
    asymmetric_pipeline: bool = key("embedding and loss each take one layer's slot on the first and last stage")
    tp_comm_overlap: bool = key("Transformer Engine userbuffer overlap of TP communication with GEMMs")
    tp_comm_overlap_cfg: Optional[Dict[str, Any]] = key(
        "userbuffer settings per GEMM (conf/userbuffers/); null: Transformer Engine's defaults"
    )
    cp_comm_type: str = key("context-parallel KV exchange: p2p, a2a, allgather or a2a+p2p")
    rank_order: RankOrder = key(
        "rank order: pp_last (megatron-core's tp-cp-ep-dp-pp) or dp_last (tp-cp-ep-pp-dp, MLPerf's TP_PP_DP_MAPPING)"
    )
    use_distributed_optimizer: bool = key("shard optimizer state over data-parallel ranks")
    overlap_grad_reduce: bool = key("overlap the gradient reduce-scatter with the backward pass")
    overlap_param_gather: bool = key("overlap the parameter all-gather with the forward pass")
    align_param_gather: bool = key("start every pipeline chunk's all-gather together")
    grad_reduce_in_fp32: bool = key("reduce gradients in fp32 (LoRA always does: its gradients are the adapters')")
    overlap_p2p_comm: bool = key("overlap pipeline sends with compute (interleaved schedule)")
    defer_embedding_wgrad_compute: bool = key("defer the output layer's weight-gradient GEMMs (needs pp > 1)")
    wgrad_deferral_limit: int = key("how many of those GEMMs are deferred", within=NON_NEGATIVE)
    recompute_granularity: Optional[Recompute] = key("activation recomputation: null, selective or full")
    recompute_method: Optional[RecomputeMethod] = key("full recomputation: uniform or block")
    recompute_num_layers: Optional[int] = key(
        "full recomputation: layers per group (uniform) or per stage (block)", within=COUNT
    )
    auto: Optional[AutoConfig] = key("parallelism=auto: the search (The auto-configurator)", default=None)
    # MLPerf 405B picks its layout by node size (conf/parallelism/mlperf_llama31_405b.yaml).
    by_node: Optional[Dict[str, Any]] = key("layouts per cluster.gpus_per_node (MLPerf 405B default)", default=None)
    node: Optional[Any] = key("the by_node entry for this cluster", default=None)


# --------------------------------------------------------------------------- cluster, one class per platform
@dataclass
class ClusterConfig:
    name: str = key("cluster name, in messages")
    platform: PlatformName = key("which renderer and submitter: local, slurm, sge, bcp or k8s")
    gpus_per_node: Optional[int] = key("GPUs per node; null: no GRES (Slurm) or count them (local)", within=COUNT)
    gpu_type: Optional[str] = key("h100, h200, a100, b200 or gb200: FP8 support, the memory check, the MFU peak")
    nvlink_multicast: bool = key("nodes have NVLink multicast (NVSwitch); false sets UB_SKIPMC=1 for userbuffers")
    env: Dict[str, str] = key("environment for every training rank, added to the recipe's own")

    @property
    def runs_here(self) -> bool:
        """The jobs run on this machine, its GPUs the job's, instead of going through a scheduler: what the plan
        (sizes from the GPUs found), the checks (tools on this PATH) and the stage commands ask of a platform."""
        return False


_RUNTIME = "how jobs enter the container: pyxis, apptainer or none (bare metal)"
_CONTAINER = "the image: a .sqsh (pyxis) or .sif (apptainer) path, or a registry reference; null: bare metal"
_SOURCE = "the base the container stage builds from: registry#image:tag or a base .sqsh/.sif path"
_WHEELS = "air-gapped builds: a directory of wheels for the declared stack; null: the package index"


@dataclass
class LocalCluster(ClusterConfig):
    container_runtime: ContainerRuntime = key(_RUNTIME + " (only the container stage uses it here)")
    container: Optional[str] = key(_CONTAINER)
    container_source: str = key(_SOURCE)
    wheel_dir: Optional[str] = key(_WHEELS)

    @property
    def runs_here(self) -> bool:
        return True


@dataclass
class BatchCluster(ClusterConfig):
    """What every batch platform has."""

    ntasks_per_node: Optional[int] = key("ranks per node; null: gpus_per_node", within=COUNT)
    time_limit: str = key("time limit of every job, HH:MM:SS")
    job_name_prefix: str = key("prefix of job names")


@dataclass
class ContainerCluster(BatchCluster):
    """Slurm and Grid Engine: jobs in a container built by the container stage, or bare metal."""

    container_runtime: ContainerRuntime = key(_RUNTIME)
    container: Optional[str] = key(_CONTAINER)
    container_source: str = key(_SOURCE)
    wheel_dir: Optional[str] = key(_WHEELS)
    container_mounts: List[str] = key("extra host[:container] mounts")
    container_writable: bool = key("a writable container (pyxis --container-writable, apptainer --writable-tmpfs)")
    signal_before_timeout_s: Optional[int] = key(
        "SIGUSR1 this many seconds before the time limit: the trainer checkpoints and exits", within=COUNT
    )


@dataclass
class SlurmCluster(ContainerCluster):
    partition: Optional[str] = key("sbatch --partition")
    account: Optional[str] = key("sbatch --account")
    exclusive: bool = key("whole nodes (--exclusive --mem=0)")
    mpi: Optional[str] = key("srun --mpi for userbuffer bootstrap (tp_comm_overlap); null: never")
    sbatch_args: List[str] = key("extra #SBATCH lines")
    srun_args: List[str] = key("extra srun arguments")


@dataclass
class SgeCluster(ContainerCluster):
    node_resource: Optional[str] = key("resource counting whole nodes (#$ -l <it>=<nodes>), e.g. node_f")
    parallel_environment: Optional[str] = key("#$ -pe <it> <slots>")
    resources: List[str] = key("extra #$ -l resources")
    qsub_args: List[str] = key("extra #$ lines")
    setup: List[str] = key("shell lines at the start of every job")
    modules: List[str] = key("environment modules loaded in every job")
    mpirun_args: List[str] = key("extra mpirun arguments")


@dataclass
class Workspace:
    id: str = key("workspace id")
    mount: str = key("mount path, the same as where main.py runs")
    mode: str = key("RW or RO", default="RW")


@dataclass
class Dataset:
    id: str = key("dataset id")
    mount: str = key("mount path")


@dataclass
class BcpCluster(BatchCluster):
    container: Optional[str] = key("the image every replica runs, by name from a registry (required)")
    instance: str = key("--instance of every replica, e.g. dgxh100.80g.8.norm")
    data_instance: Optional[str] = key("--instance for data preparation; null: instance")
    ace: Optional[str] = key("--ace; null: the NGC CLI's configuration")
    org: Optional[str] = key("--org; null: the NGC CLI's configuration")
    team: Optional[str] = key("--team; null: the NGC CLI's configuration")
    workspaces: List[Workspace] = key("--workspace mounts: [{id, mount, mode}]")
    datasets: List[Dataset] = key("--datasetid mounts: [{id, mount}]")
    result: str = key("--result: the job's result directory")
    ngc_args: List[str] = key("extra `ngc base-command job run` options")
    poll_interval_s: int = key("seconds between checks of a job the next one waits for", within=NON_NEGATIVE)


@dataclass
class Volume:
    claim: str = key("PersistentVolumeClaim name")
    mount: str = key("mount path, the same as on the machine that runs main.py")


@dataclass
class K8sCluster(BatchCluster):
    namespace: Optional[str] = key("namespace; null: kubectl's current context")
    container: Optional[str] = key("the image every pod runs, by name from a registry (required)")
    image_pull_secrets: List[str] = key("secrets for a private registry")
    volumes: List[Volume] = key("PersistentVolumeClaims: [{claim, mount}]")
    resources: Dict[str, Any] = key("more limits per training pod, e.g. {rdma/ib: 8}")
    node_selector: Dict[str, str] = key("node selector of the pods")
    tolerations: List[Dict[str, Any]] = key("tolerations of the pods")
    shm_size: str = key("/dev/shm per pod")
    master_port: int = key("rendezvous port on pod 0", within=PORT)
    signal_before_timeout_s: Optional[int] = key("grace after the deadline's SIGTERM for the checkpoint", within=COUNT)
    poll_interval_s: int = key("seconds between checks of a job the next one waits for", within=NON_NEGATIVE)


# --------------------------------------------------------------------------- data preparation, one class per source
@dataclass
class DownloadConfig:
    retries: int = key("attempts after the first", within=NON_NEGATIVE)
    backoff_s: float = key("first wait between attempts (doubles each time)", within=NON_NEGATIVE)
    max_backoff_s: float = key("longest wait between attempts", within=NON_NEGATIVE)
    timeout_s: float = key("socket timeout", within=POSITIVE)


@dataclass
class DataJobConfig:
    time_limit: str = key("time limit of each data-preparation task")
    cpus_per_task: Optional[int] = key("CPUs per task; null: a whole node", within=COUNT)
    max_parallel: Optional[int] = key("at most this many tasks at once; null: no limit", within=COUNT)


@dataclass
class DataPreparationConfig:
    name: str = key("source name")
    output_dir: str = key("where .bin/.idx are written (absolute)")
    download_dir: str = key("where downloads land")
    keep_downloads: bool = key("keep downloads after their shard is tokenized")
    checksums_file: Optional[str] = key("sha256sum-format list checked against downloads")
    text_key: str = key("JSON key holding a document's text")
    format: InputFormat = key("auto (from the file name), jsonl or text")
    text_document: TextDocument = key("plain text: one document per line or per file")
    append_eod: bool = key("end every document with the tokenizer's EOD token")
    tokenizer: TokenizerConfig = group(TokenizerConfig, "tokenizer (training's unless overridden)")
    workers: Any = key("tokenizer processes per shard: a positive integer or auto (the CPUs this process may use)")
    chunk_bytes: int = key("input handed to a worker at a time, whole lines (tuning only)", within=CHUNK_BYTES)
    download: DownloadConfig = group(DownloadConfig, "retries and timeouts")
    job: DataJobConfig = group(DataJobConfig, "batch platforms: each task's size")


@dataclass
class PileData(DataPreparationConfig):
    file_numbers: Any = key('shards to prepare: "0-1", "3", "0,2,5-7", or a list of numbers')
    num_files: int = key("shards the source has", within=COUNT)
    base_url: str = key("where shards come from: URL, local directory or file:// URL")
    file_template: str = key("shard file name, formatted with its number")
    output_template: str = key("output name, formatted with the shard number")


@dataclass
class C4Train:
    file_template: str = key("train file name, formatted with its number")
    num_files: int = key("train files", within=COUNT)
    merged_files: int = key("groups of consecutive files merged into one", within=COUNT)
    tokenize: Any = key('merged files to tokenize: "6-7", "6", or a list of numbers')
    output_template: str = key("output name, formatted with the merged file's number")


@dataclass
class C4Validation:
    enabled: bool = key("prepare the validation subset")
    file_template: str = key("validation file name, formatted with its number")
    num_files: int = key("validation files", within=COUNT)
    max_documents: int = key("keep the first N documents", within=COUNT)
    output_name: str = key("output name")


@dataclass
class C4Data(DataPreparationConfig):
    base_url: str = key("where the en/ files are: URL, local directory or file:// URL")
    train: C4Train = group(C4Train, "the MLPerf merge of the train files")
    validation: C4Validation = group(C4Validation, "the validation subset")


@dataclass
class FilesData(DataPreparationConfig):
    inputs: List[str] = key("paths, glob patterns or URLs of .jsonl/.json/.txt files (.zst, .gz)")
    merge: bool = key("all inputs into one output")
    output_name: str = key("the merged output's name")


@dataclass
class SftData(DataPreparationConfig):
    """What the fine-tuning sources share: samples with loss masks, and what happens to long ones."""

    max_length: Optional[int] = key("longest sample in tokens (training.seq_length); null: no limit", within=COUNT)
    truncate: bool = key("cut samples longer than max_length; false: fail naming the sample, nothing written")


@dataclass
class SftJsonlData(SftData):
    inputs: List[str] = key("paths, glob patterns or URLs of prompt/response JSON lines (.jsonl, .zst, .gz)")
    merge: bool = key("all inputs into one output")
    output_name: str = key("the merged output's name")
    prompt_key: str = key("JSON key of the prompt (not trained on)")
    response_key: str = key("JSON key of the response (trained on)")
    chat_template: bool = key("wrap prompt and response in the tokenizer's chat template (tokenizer_config.json)")


@dataclass
class GovReportData(SftData):
    base_url: str = key("the dataset's files: local directory, file:// URL or URL (the hub's resolve/main/data)")
    train_files: List[str] = key("train files under base_url (.parquet or JSON lines)")
    validation_files: List[str] = key("validation files under base_url")


# --------------------------------------------------------------------------- observability
@dataclass
class WandbConfig:
    enabled: bool = key("log to Weights & Biases")
    project: str = key("W&B project")
    entity: Optional[str] = key("W&B entity")
    name: Optional[str] = key("W&B run name; null: run_name")
    mode: WandbMode = key("auto (online when reachable), online or offline")


@dataclass
class LoggingConfig:
    tensorboard: bool = key("TensorBoard event files in RUN_DIR/tensorboard/")
    wandb: WandbConfig = group(WandbConfig, "Weights & Biases")


@dataclass
class ProfileConfig:
    enabled: bool = key("profile a window of steps")
    tool: ProfileTool = key("torch (torch.profiler traces) or nsys (Nsight Systems)")
    start_step: int = key("first profiled step", within=COUNT)
    end_step: int = key("first step after the window", within=COUNT)
    ranks: List[int] = key("global ranks to profile", within=NON_NEGATIVE)
    nsys_args: List[str] = key("more nsys profile options")
    record_shapes: bool = key("torch profiler: tensor shapes")
    with_stack: bool = key("torch profiler: Python stacks")


@dataclass
class TelemetryConfig:
    enabled: bool = key("sample GPU utilisation, memory, power, clocks into RUN_DIR/telemetry/")
    interval_s: float = key("seconds between samples", within=POSITIVE)
    flag_utilization_below: float = key(
        "the report flags GPUs below this share of the median utilisation", within=SHARE
    )
    flag_sm_clock_below: float = key("the report flags GPUs below this share of the median SM clock", within=SHARE)


@dataclass
class PreflightConfig:
    min_busbw_gbps: Optional[float] = key(
        "fail below this all-reduce bus bandwidth, GB/s; null: the GPU type's", within=POSITIVE
    )
    min_busbw_gbps_by_gpu_type: Dict[str, float] = key("default thresholds per cluster.gpu_type", within=POSITIVE)
    sizes_mib: Optional[List[float]] = key(
        "message sizes in MiB; null: powers of two and training's sizes", within=POSITIVE
    )
    max_size_mib: int = key("largest message of the default sizes, MiB", within=COUNT)
    warmup_iterations: int = key("untimed iterations per size", within=NON_NEGATIVE)
    iterations: int = key("timed iterations per size", within=COUNT)
    slow_node_fraction: float = key("name nodes below this share of their peers' median", within=SHARE_ABOVE_0)
    time_limit: str = key("time limit of the preflight job")


# --------------------------------------------------------------------------- long runs
@dataclass
class StragglerConfig:
    enabled: bool = key("rank the GPUs by their relative speed every interval_steps (nvidia-resiliency-ext)")
    interval_steps: int = key("steps between reports", within=COUNT)
    threshold: float = key("name the GPUs below this share of the fastest one's speed", within=SHARE_ABOVE_0)


@dataclass
class FaultConfig:
    kind: Optional[FaultKind] = key(
        "null (none), hang, crash (os._exit), kill (SIGKILL) or enospc (a full disk under the checkpoint being "
        "written, with during=save): once, never again after the restart it causes"
    )
    rank: int = key("the global rank that fails", within=NON_NEGATIVE)
    step: int = key("the step it fails at", within=COUNT)
    during: FaultPoint = key("step: as the step begins; save: while the step's checkpoint is being written")


@dataclass
class ResilienceConfig:
    job_restarts: int = key(
        "more jobs queued after the first, each continuing from the newest checkpoint after "
        "a time limit or a failure (Slurm, Grid Engine)",
        within=NON_NEGATIVE,
    )
    in_job_restarts: int = key(
        "restarts of every rank in the same allocation after a hang or a crash "
        "(ft_launcher; needs nvidia-resiliency-ext)",
        within=NON_NEGATIVE,
    )
    hang_timeout_s: float = key(
        "a rank silent this long in a step (or between steps) is hung: every rank restarts", within=TIMEOUT
    )
    startup_timeout_s: float = key(
        "the same for a rank's start: building, loading, the first step's warm-up", within=TIMEOUT
    )
    checkpoint_timeout_s: float = key(
        "the same for a checkpoint save (the wait for the previous one included)", within=TIMEOUT
    )
    straggler_detection: StragglerConfig = group(
        StragglerConfig, "slow GPUs named in the log, metrics.jsonl and the report"
    )
    inject_fault: FaultConfig = group(FaultConfig, "make a rank fail on purpose (tests, trying a setup)")


# --------------------------------------------------------------------------- the training stack
@dataclass
class PythonVersion:
    tested: str = key("version the GPU tests ran on")
    supported: str = key("versions the check accepts (PEP 440)")


@dataclass
class StackPackage:
    module: str = key("module imported to find it")
    distribution: str = key("distribution name on the package index")
    extras: List[str] = key("extras installed with it")
    tested: str = key("version the GPU tests ran on")
    supported: str = key("versions the check accepts (PEP 440)")
    install: bool = key("python -m recipes.stack install installs it")


@dataclass
class TorchPackage(StackPackage):
    cpu_build: str = key("the CPU build dev.sh installs where no training stack is found")


@dataclass
class StackConfig:
    python: PythonVersion = group(PythonVersion, "the interpreter")
    torch: TorchPackage = group(TorchPackage, "from the base image, never reinstalled")
    megatron_core: StackPackage = group(StackPackage, "megatron-core")
    transformer_engine: StackPackage = group(StackPackage, "Transformer Engine")
    requirements: List[str] = key("the recipes' own GPU-side dependencies")
    min_compute_capability: Dict[str, str] = key("lowest CUDA compute capability per precision")


# --------------------------------------------------------------------------- MLPerf
@dataclass
class MLPerfRules:
    seq_length: int = key("max_sequence_length", within=COUNT)
    eval_samples: int = key("eval_samples", within=COUNT)
    eval_every_samples: int = key("training sequences between evaluations", within=COUNT)
    target: float = key("eval_accuracy target (log perplexity)", within=POSITIVE)
    max_steps: int = key("the schedule's horizon", within=COUNT)
    adam_beta1: float = key("opt_adamw_beta_1", within=BETA)
    adam_beta2: float = key("opt_adamw_beta_2", within=BETA)
    adam_eps: float = key("opt_adamw_epsilon", within=POSITIVE)
    weight_decay: float = key("opt_adamw_weight_decay", within=NON_NEGATIVE)
    clip_grad: float = key("opt_gradient_clip_norm", within=NON_NEGATIVE)
    starts_from_checkpoint: bool = key("the benchmark starts from a checkpoint")
    reference_gbs: Optional[int] = key("batch size the LR and warmup are given for (405B)", default=None, within=COUNT)
    lr_at_reference_gbs: Optional[float] = key("LR at reference_gbs", default=None, within=POSITIVE)
    warmup_steps_at_reference_gbs: Optional[int] = key("warmup at reference_gbs", default=None, within=NON_NEGATIVE)
    eval_skip_per_gbs: float = key(
        "evaluations skipped at the start: floor(this x GBS + eval_skip_base) (Llama 2 70B LoRA: 0.125)",
        default=0.0,
        within=NON_NEGATIVE,
    )
    eval_skip_base: int = key("see eval_skip_per_gbs (Llama 2 70B LoRA: 2)", default=0, within=NON_NEGATIVE)
    lora_rank: Optional[int] = key("lora_rank the benchmark fixes; null: no LoRA", default=None, within=COUNT)
    lora_alpha: Optional[float] = key("lora_alpha of the reference", default=None, within=POSITIVE)
    lora_dropout: Optional[float] = key("LoRA dropout of the reference", default=None, within=SHARE_BELOW_1)
    lora_targets: Optional[List[str]] = key("the reference's adapted layers (megatron-core names)", default=None)
    base_model: Optional[str] = key("the Hugging Face model the benchmark starts from", default=None)


@dataclass
class MLPerfConfig:
    benchmark: str = key("submission_benchmark")
    ruleset: str = key("compliance checker ruleset, e.g. 6.1.0")
    division: str = key("closed or open")
    org: str = key("submission_org")
    platform: Optional[str] = key("submission_platform; null: <nodes>x<GPUs per node>x<GPU>")
    status: str = key("submission_status: onprem, cloud, preview or research")
    data_dir: str = key("where the benchmark's data is prepared and read")
    result_runs: int = key("runs per result (olympic mean)", within=COUNT)
    drop_caches: bool = key("drop the page cache on every node before the run")
    log_file: str = key("MLLOG file in the run directory")
    allow_random_init: bool = key("start a benchmark defined from a checkpoint with random weights (smoke tests)")
    rules: MLPerfRules = group(MLPerfRules, "what the benchmark fixes")


# --------------------------------------------------------------------------- evaluation
@dataclass
class EvalBlend:
    name: str = key("the blend's name in the results (letters, digits, '.', '_', '-')")
    prefixes: List[str] = key("data preparation outputs (.bin/.idx prefixes), read in order")
    samples: Optional[int] = key(
        "sequences of seq_length tokens to evaluate; null: as many as the trainer's validation",
        default=None,
        within=COUNT,
    )


@dataclass
class EvaluationConfig:
    tasks: List[str] = key("lm-evaluation-harness tasks run on the Hugging Face model (the default suite: NeMo's)")
    num_fewshot: Optional[int] = key("few-shot examples per task; null: each task's own", within=NON_NEGATIVE)
    batch_size: int = key("lm-eval's batch size", within=COUNT)
    limit: Optional[int] = key("at most this many items per task (smoke tests); null: every item", within=COUNT)
    dtype: str = key("dtype the Hugging Face model is loaded in: bfloat16, float16 or float32")
    model: Optional[str] = key(
        "a Hugging Face directory to evaluate; null: the run's export (training.checkpoint.export_dir, else RUN_DIR/hf)"
    )
    data_dir: str = key("the tasks' data, prepared on a machine with internet by python -m recipes.evaluation fetch")
    include_path: Optional[str] = key("a directory of your own lm-eval task YAMLs (tasks then names them)")
    heldout: List[str] = key("JSON-lines or text files: held-out perplexity (word, byte, bits per byte)")
    heldout_text_key: str = key("the JSON key holding a held-out document's text")
    heldout_max_length: Optional[int] = key(
        "tokens per rolling window of the held-out task; null: training.seq_length", within=COUNT
    )
    blends: List[EvalBlend] = key("named .bin/.idx blends whose loss the trainer computes from the newest checkpoint")
    time_limit: Optional[str] = key("time limit of the evaluation jobs; null: cluster.time_limit")


# --------------------------------------------------------------------------- the whole config
@dataclass
class Config:
    training: TrainingConfig = group(TrainingConfig, "model, optimizer, schedule, data, checkpoints")
    peft: PeftConfig = key("fine-tuning: none or lora (conf/peft/)")
    dtype: DtypeConfig = group(DtypeConfig, "precision")
    parallelism: ParallelismConfig = group(ParallelismConfig, "the layout")
    cluster: ClusterConfig = key("where jobs run")
    data_preparation: DataPreparationConfig = key("the data_preparation stage")
    stack: StackConfig = group(StackConfig, "the training stack (conf/stack.yaml)")
    logging: LoggingConfig = group(LoggingConfig, "experiment tracking")
    profile: ProfileConfig = group(ProfileConfig, "profiling window")
    telemetry: TelemetryConfig = group(TelemetryConfig, "GPU telemetry")
    preflight: PreflightConfig = group(PreflightConfig, "network preflight stage")
    resilience: ResilienceConfig = group(ResilienceConfig, "restarts, hang detection, stragglers (long runs)")
    mlperf: Optional[MLPerfConfig] = key("MLPerf Training benchmark settings (training=mlperf/...)", default=None)
    evaluation: EvaluationConfig = group(EvaluationConfig, "the evaluation stage: held-out loss, benchmark tasks")
    stages: List[Stage] = key(
        "stages to run, in order: container, data_preparation, preflight, training, export, evaluation"
    )
    dry_run: bool = key("plan, validate and write everything; submit and run nothing")
    results_dir: str = key("run directories go under it")
    run_name: Optional[str] = key(
        "the run directory's name; null: <model>_<dtype>_<layout>_<N>gpu for training, "
        "data_<source>[_<output directory name>] for data preparation alone, eval_<directory> for evaluating "
        "evaluation.model alone, container_<image> for the image alone"
    )
    seed: int = key("random seed", within=SEED)
    memory_check: bool = key(
        "fail when the memory estimate exceeds the GPU, warn within 5% under it; false accepts the risk"
    )
    stack_check: bool = key("ranks and data preparation check the training stack first; false accepts the risk")


CLUSTERS = {"local": LocalCluster, "slurm": SlurmCluster, "sge": SgeCluster, "bcp": BcpCluster, "k8s": K8sCluster}
DATA_SOURCES = {
    "pile": PileData,
    "c4": C4Data,
    "files": FilesData,
    "sft_jsonl": SftJsonlData,
    "govreport_mlperf": GovReportData,
}
PEFT_METHODS = {"none": PeftConfig, "lora": LoraConfig}


VARIANTS: Variants = {
    ClusterConfig: ("platform", CLUSTERS),
    DataPreparationConfig: ("name", DATA_SOURCES),
    PeftConfig: ("method", PEFT_METHODS),
}


def load_config(plain: Mapping[str, Any]) -> Config:
    """The resolved config (config.yaml, or what Hydra composed) as typed objects; raises TypedConfigError naming
    the key whose value does not fit."""
    return from_plain(Config, plain, VARIANTS)


def packs_sequences(cfg: Config) -> bool:
    """The run trains on packed fine-tuning sequences (THD with cu_seqlens) rather than one sequence per row:
    training.data.packing applies to SFT data only."""
    return cfg.training.data.format == DataFormat.sft and bool(cfg.training.data.packing)


def reduces_grads_in_fp32(cfg: Config) -> bool:
    """parallelism.grad_reduce_in_fp32, and always for LoRA: its gradient buffers hold the adapters' alone (megabytes
    where the base has gigabytes), so summing every microbatch's gradient in bf16 would cost the adapters precision
    and save nothing."""
    return bool(cfg.parallelism.grad_reduce_in_fp32) or isinstance(cfg.peft, LoraConfig)
