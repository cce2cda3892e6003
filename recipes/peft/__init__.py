"""Parameter-efficient fine-tuning: model transforms the trainer applies to the built model chunks before the DDP
wrapper (peft=lora: recipes/peft/lora.py). Below the trainer: it imports recipes/runtime and megatron-core only."""
