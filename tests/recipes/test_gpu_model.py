"""The megatron-core Llama against Hugging Face transformers on one GPU: same weights, same tokens, same
logits to bf16 tolerance (RoPE scaling active)."""

import socket

import pytest

from launcher.config.compose import compose
from launcher.plan.build import build_plan
from launcher.plan.hardware import LocalGpus

pytestmark = pytest.mark.gpu


@pytest.fixture
def single_rank():
    from recipes.trainer import wgrad_fallback

    wgrad_fallback.install()  # before megatron is imported
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    yield
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def test_megatron_llama_matches_transformers(single_rank):
    import torch
    from transformers import LlamaForCausalLM

    from recipes.hf import mapping
    from recipes.trainer import model as model_lib, settings

    # A small random Llama 3.1 with a short vocabulary; RoPE base 500000 and the Llama 3.1 frequency scaling.
    cfg = compose(
        [
            "training.model.vocab_size=4000",
            "training.model.num_layers=3",
            "training.seq_length=1024",
            "cluster.gpus_per_node=1",
        ]
    )
    plan = build_plan(cfg, LocalGpus(1, "h100", ("gpu",)))
    model_cfg = cfg.training.model
    assert model_cfg.rope_scaling is not None
    config = settings.transformer_config(cfg, plan, grad_accum_fusion=False)
    megatron_model = model_lib.build_model_chunks(config, cfg, plan)[0].eval()

    state = {k: v for k, v in megatron_model.state_dict().items() if not k.endswith("_extra_state")}
    hf_state = mapping.megatron_to_hf(state, model_cfg)
    reference = LlamaForCausalLM(mapping.hf_config(model_cfg)).cuda().float().eval()
    missing, unexpected = reference.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    hf_bf16 = LlamaForCausalLM(mapping.hf_config(model_cfg)).cuda().to(torch.bfloat16).eval()
    hf_bf16.load_state_dict(hf_state, strict=False)

    torch.manual_seed(0)
    tokens = torch.randint(0, model_cfg.vocab_size, (2, 1024), device="cuda")
    positions = torch.arange(1024, device="cuda").unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        ours = megatron_model(tokens, positions, None)[..., : model_cfg.vocab_size].float()
        ref = reference(tokens).logits.float()
        ref_bf16 = hf_bf16(tokens).logits.float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    ours_err, bf16_err = rel(ours, ref), rel(ref_bf16, ref)
    print(
        f"\nlogits vs fp32 transformers: megatron bf16 rel. error {ours_err:.2e}; transformers bf16 {bf16_err:.2e}; "
        f"max abs diff {(ours - ref).abs().max().item():.3e}"
    )
    assert ours_err < 2e-2
    assert ours_err < 3 * bf16_err + 1e-3  # within bf16 noise: no worse than the reference's own bf16 error
    # The round trip back into megatron's layout restores the same tensors.
    back = mapping.hf_to_megatron(hf_state, model_cfg, plan.padded_vocab_size)
    vocab = model_cfg.vocab_size
    for key, value in back.items():
        rows = slice(0, vocab) if key in ("embedding.word_embeddings.weight", "output_layer.weight") else slice(None)
        assert torch.equal(value[rows], state[key][rows]), key


@pytest.mark.parametrize("fusion", ["native", "te", "none"])
def test_each_loss_kernel_matches_an_fp32_reference_loss_and_gradient(single_rank, fusion):
    """training.model.cross_entropy_fusion's kernels, through the TransformerConfig the trainer builds and
    megatron-core's LanguageModule.compute_language_model_loss (which picks the kernel from it), on bf16 logits of
    Llama 3's vocabulary at the scale trained models reach: the per-token loss within fp32 rounding of torch's
    cross entropy in fp32 on the same values, and the logits' gradient within bf16 rounding of its fp32 one
    (Transformer Engine's kernel once kept an intermediate gradient in the bf16 input buffer, which this catches)."""
    import torch
    from megatron.core.models.common.language_module.language_module import LanguageModule

    from recipes.trainer import settings

    cfg = compose(
        [f"training.model.cross_entropy_fusion={fusion}", "training.model.num_layers=1", "cluster.gpus_per_node=1"]
    )
    config = settings.transformer_config(cfg, build_plan(cfg, LocalGpus(1, "h100", ("gpu",))), grad_accum_fusion=False)
    assert (config.cross_entropy_loss_fusion, config.cross_entropy_fusion_impl) == settings.CROSS_ENTROPY[fusion]
    language_model = LanguageModule(config)
    torch.manual_seed(0)
    seq, batch, vocab = 4096, 2, 128256
    # Logits of a trained model: a few large ones per position over a spread-out rest.
    logits = (torch.randn(seq, batch, vocab, device="cuda") * 3).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (seq, batch), device="cuda")
    # The trainer's per-token loss: each token's loss summed, then divided by the token count (a mask of padding).
    weights = (torch.rand(seq, batch, device="cuda") > 0.1).float() / (seq * batch)

    reference_logits = logits.float().requires_grad_()
    reference = torch.nn.functional.cross_entropy(
        reference_logits.view(-1, vocab), labels.view(-1), reduction="none"
    ).view(seq, batch)
    (reference * weights).sum().backward()

    ours_logits = logits.clone().requires_grad_()
    loss = language_model.compute_language_model_loss(labels.t(), ours_logits).t()  # it takes [b, s], gives [b, s]
    (loss.float() * weights).sum().backward()

    loss_error = (loss.float() - reference).abs().max().item()
    grad, reference_grad = ours_logits.grad.float(), reference_logits.grad
    grad_error = ((grad - reference_grad).norm() / reference_grad.norm()).item()
    print(f"\n{fusion}: max |loss - fp32| {loss_error:.2e}; logits' gradient, relative error {grad_error:.2e}")
    assert loss_error < 1e-3 * reference.abs().max().item()
    assert grad_error < 2**-8  # bf16 keeps 8 bits of mantissa: rounding alone is under half of that
