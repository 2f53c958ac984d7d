"""Compose capability adapters into one model: task router (paper), token-level top-1 MoE (ours), linear merge."""

from __future__ import annotations

METHODS = ("router", "moe", "merge")
COMPOSITION_FILE = "composition.yaml"
GATES_FILE = "gates.safetensors"
MERGED_DIR = "merged"
BASE_SLOT = "base"  # the expert slot / router label that means "no adapter"
