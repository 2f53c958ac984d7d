"""Trainers: SFT on demonstrations (plain PyTorch) and GRPO LoRA adapters (TRL + PEFT; the only place that imports trl)."""
