"""Parameter-efficient fine-tuning: model transforms the trainer applies to the built model chunks before the DDP
wrapper (peft=lora: recipes/peft/lora.py), and their tensors as Hugging Face PEFT names them (recipes/peft/hf.py,
which the exporter uses). Below the trainer: lora.py imports recipes/runtime and megatron-core only, hf.py torch and
recipes/hf/mapping.py only."""
