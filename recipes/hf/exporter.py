"""Export a checkpoint of this recipe to Hugging Face `LlamaForCausalLM` (what transformers, vLLM and
lm-eval-harness read):

    python -m recipes.hf.exporter --checkpoint RUN_DIR/checkpoints/iter_0001000 --out DIR

writes `model-0000K-of-0000N.safetensors` shards with `model.safetensors.index.json`, `config.json`,
`generation_config.json` and the run's tokenizer files (recipes/hf/checkpoint_to_hf.py does it). A LoRA run's
checkpoint (peft=lora) exports merged into its base; with --peft, as a Hugging Face PEFT adapter directory
(adapter_config.json, adapter_model.safetensors) for `peft.PeftModel.from_pretrained` on that base. Only the
command line lives here: torch and megatron's checkpoint reader load after the arguments are parsed, so --help
and a mistyped option answer at once."""

from __future__ import annotations

import argparse
import sys

from common.safetensors_io import DTYPE_CODES


def _size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="RUN_DIR/checkpoints/iter_NNNNNNN (a run directory: its newest complete checkpoint)",
    )
    parser.add_argument("--out", required=True, help="directory to write the Hugging Face model into")
    parser.add_argument("--config", help="the run's config.yaml (default: two levels above the checkpoint)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_CODES))
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (default 5GB)")
    parser.add_argument("--tokenizer", help="tokenizer directory or file to copy (default: training.tokenizer.path)")
    parser.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--peft", action="store_true", help="a LoRA checkpoint: write its Hugging Face PEFT adapter directory"
    )
    parser.add_argument("--base", help="a LoRA checkpoint's base, where it is now (default: where the run read it)")
    args = parser.parse_args(argv)
    from recipes.hf.checkpoint_to_hf import ExportError, export, export_peft, resolve_checkpoint, run_config_for

    try:
        checkpoint = resolve_checkpoint(args.checkpoint)
        if args.peft:
            out = export_peft(checkpoint, args.out, run_config=run_config_for(checkpoint, args.config))
            print(f"exported the adapters of {checkpoint} -> {out}")
            return 0
        out = export(
            checkpoint,
            args.out,
            run_config=run_config_for(checkpoint, args.config),
            dtype=args.dtype,
            max_shard_bytes=_size(args.max_shard_size),
            tokenizer=args.tokenizer,
            copy_tokenizer=not args.no_tokenizer,
            progress=not args.no_progress,
            base=args.base,
        )
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {checkpoint} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
