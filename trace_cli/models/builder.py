"""Build a small Qwen3-architecture causal LM and a byte-level BPE tokenizer fully offline.

The tokenizer is trained on text rendered from episodes of the registered environments (system prompts, tool
schemas, reference transcripts), which the calling stage replays and hands in (this layer knows no
environment). Digits are isolated (one token each, so ids and amounts are copied digit by
digit), and so is every newline: the generation prompt ends in a newline ("...</think>\n\n"), so no merge may
cross it, or the tokens of a full transcript would not start with the tokens of the prompt the model acted
on (e.g. "\nYour" as one token in training, while at inference the prompt already ends in "\n\n"); SFT
would then teach continuations the model never meets when generating. Unlike GPT-2's regex split, merges
may cross spaces and punctuation: repeated tool-schema JSON
collapses into a few tokens (~3.4x shorter transcripts than GPT-2-style splitting on the shop world), which is
what makes CPU training of a base agent practical. It is still byte-level: any byte sequence round-trips.
Tool-call markup tokens are added as *non-special* tokens: TRL decodes completions with
skip_special_tokens=True, which would otherwise strip them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # ~0.2 M parameters: unit tests, seconds to build and to train a few steps.
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
    # ~3 M parameters: the demo's base agent, trained on CPU in minutes.
    "small": {
        "vocab_size": 6144,
        "hidden_size": 192,
        "intermediate_size": 576,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 32,
    },
}
# Enters the `model` stage's artifact id with the resolved preset: bump it when a change here makes the same
# config build a different model or tokenizer, so stores do not keep serving the old build as "up to date".
BUILDER_VERSION = 3  # 2: newlines isolated by the pre-tokenizer; 3: emails and capitalised words isolated
EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]+"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
MAX_POSITIONS = 4096


def corpus(episodes: Iterable[dict[str, Any]]) -> list[str]:
    """The tokenizer's training texts: each episode ({messages, tools}: reference solutions and deficit
    demonstrations of the registered environments, replayed by the stage) rendered with the Qwen3 template."""
    from trace_cli.models.chat import render

    tok = _bare_tokenizer()
    return [render(tok, ep["messages"], ep["tools"], add_generation_prompt=False) for ep in episodes]


def _bare_tokenizer():
    """A tokenizer object only used to render templates before the real vocabulary exists."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trace_cli.models.templates import qwen3_template

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen3_template()
    return tok


def build_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trace_cli.models.templates import qwen3_template

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # an email, a capitalised word (names, products) are pre-tokens of their own: merges may not
            # fuse them with the text around them ("Hello, my name is Priya Sato and my zip is " was one
            # token), or the model could not copy them from its context
            pre_tokenizers.Split(Regex(EMAIL), behavior="isolated"),
            pre_tokenizers.Split(Regex(r"\d{1,3}|\n|[A-Z][a-z]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=64,
    )
    t.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        truncation_side="left",
        model_max_length=MAX_POSITIONS,
    )
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKUP])
    tok.chat_template = qwen3_template()
    return tok


def build_model(tokenizer, preset: str, seed: int, arch: dict[str, Any] | None = None):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    spec = {"max_position_embeddings": MAX_POSITIONS}
    spec.update({k: v for k, v in PRESETS[preset].items() if k != "vocab_size"})
    spec.update(arch or {})
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **spec,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, do_sample=False
    )
    return model


def build(
    out_dir: Path,
    *,
    preset: str,
    seed: int,
    episodes: Iterable[dict[str, Any]],
    vocab_size: int | None = None,
    arch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the tokenizer on `episodes` (see corpus), build the model, save both in Hugging Face format;
    return a summary."""
    texts = corpus(episodes)
    tok = build_tokenizer(texts, vocab_size or PRESETS[preset]["vocab_size"])
    if arch and arch.get("max_position_embeddings"):
        tok.model_max_length = arch["max_position_embeddings"]
    model = build_model(tok, preset, seed, arch)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    n_tokens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts[:200]]
    return {
        "preset": preset,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "corpus_texts": len(texts),
        "mean_transcript_tokens": round(sum(n_tokens) / max(1, len(n_tokens)), 1),
        "chars_per_token": round(sum(len(t) for t in texts[:200]) / max(1, sum(n_tokens)), 2),
    }
