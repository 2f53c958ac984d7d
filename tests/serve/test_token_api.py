"""`trace serve --enable-lora` speaks vLLM's token-level API on a real loopback server: `/v1/completions` with
token-id prompts (token ids and per-token log-probabilities back), LoRA adapters loaded, served under their
`lora_name` and unloaded with `/v1/load_lora_adapter` / `/v1/unload_lora_adapter`; and the `server` rollout
engine (agents/engines.py) that sends it."""

from __future__ import annotations

import math

import pytest
import tinymodel  # noqa: E402
from serving import http, trace_serve  # noqa: E402

from trace_cli.agents.engines import Draw, ServerEngine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tiny = tinymodel.tiny(tmp_path_factory)
    from trace_cli.store import Store

    Store(tiny.store_root).set_name("model", "tiny", tiny.id)
    log = tmp_path_factory.mktemp("lora-serve") / "stderr.txt"
    with trace_serve("store://model/tiny", tiny.store_root, log) as srv:
        yield tiny, srv


@pytest.fixture(scope="module")
def hf(served):
    """The same model in this process: (model, tokenizer, stop ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.models.chat import eos_ids

    tiny, _ = served
    tok = AutoTokenizer.from_pretrained(tiny.hf)
    model = AutoModelForCausalLM.from_pretrained(tiny.hf).eval()
    return model, tok, eos_ids(tok, model.generation_config)


@pytest.fixture(scope="module")
def adapter(served, hf, tmp_path_factory):
    """A LoRA of the tiny model with random (not zero) weights, so it changes what the model says."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tiny, _ = served
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny.hf)
    cfg = LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(base, cfg)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    peft.save_pretrained(out)
    return out, peft.eval()


def _prompts(tok) -> list[list[int]]:
    from trace_cli.models.chat import render

    msgs = [
        [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Where is order #W1000001?"},
        ],
        [{"role": "user", "content": "Cancel it please."}],
    ]
    return [
        tok(render(tok, m, None, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        for m in msgs
    ]


def _greedy(model, prompt: list[int], n: int, stops: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens of `model` after `prompt` (cut after the first stop) and their log-probabilities, from one
    forward pass over prompt + completion."""
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=stops
        )
        ids = out[0, len(prompt) :].tolist()
        cut = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
        ids = ids[:cut]
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
        lps = logits.log_softmax(-1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return ids, lps.tolist()


def _complete(base: str, model: str, prompt: list[int], **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0.0, "logprobs": 0}
    return http("POST", f"{base}/completions", {**body, "return_token_ids": True, **kw})


def test_token_prompt_greedy_gives_the_models_tokens_and_logprobs(served, hf):
    """Token ids in, the model's own greedy tokens and their log-probabilities out (vLLM's fields)."""
    _, srv = served
    model, tok, stops = hf
    for prompt in _prompts(tok):
        status, body = _complete(srv.base, "tiny", prompt, return_tokens_as_token_ids=True)
        assert status == 200, body
        choice = body["choices"][0]
        ids, lps = _greedy(model, prompt, 12, stops)
        assert choice["token_ids"] == ids
        assert choice["prompt_token_ids"] == prompt
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(lps, abs=1e-4)
        assert choice["finish_reason"] == ("stop" if ids[-1] in stops else "length")
        assert body["usage"]["completion_tokens"] == len(ids)


def test_bad_completion_requests_get_400s(served, hf):
    _, srv = served
    _, tok, _ = hf
    vocab = len(tok)
    assert _complete(srv.base, "tiny", [vocab + 5])[0] == 400
    assert _complete(srv.base, "tiny", [1, 2], n=2)[0] == 400
    assert _complete(srv.base, "tiny", [1, 2], stream=True)[0] == 400
    assert _complete(srv.base, "nope", [1, 2])[0] == 404
    status, body = _complete(srv.base, "tiny", [1, 2], max_tokens=10**7)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


def test_lora_adapters_load_serve_and_unload(served, hf, adapter):
    """A loaded adapter is listed, generates as base + adapter does in this process, and is gone once unloaded;
    loading a name twice or a directory without an adapter is refused."""
    _, srv = served
    _, tok, stops = hf
    path, peft = adapter
    status, text = http("POST", f"{srv.base}/load_lora_adapter", {"lora_name": "a1", "lora_path": str(path)})
    assert status == 200 and "a1" in text, text
    listed = {m["id"]: m for m in http("GET", f"{srv.base}/models")[1]["data"]}
    assert listed["a1"]["parent"] == "tiny" and listed["a1"]["root"] == str(path)
    prompt = _prompts(tok)[0]
    _, with_lora = _complete(srv.base, "a1", prompt)
    _, base = _complete(srv.base, "tiny", prompt)
    ids, lps = _greedy(peft, prompt, 12, stops)
    assert with_lora["choices"][0]["token_ids"] == ids
    assert with_lora["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(lps, abs=1e-4)
    assert (
        with_lora["choices"][0]["logprobs"]["token_logprobs"]
        != base["choices"][0]["logprobs"]["token_logprobs"]
    )

    chat = {"messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 8, "temperature": 0.0}
    replies = [http("POST", f"{srv.base}/chat/completions", {**chat, "model": m}) for m in ("a1", "tiny")]
    assert [r[0] for r in replies] == [200, 200]  # chat completions name the adapter as their model too
    assert replies[0][1]["model"] == "a1"
    assert (
        http("POST", f"{srv.base}/load_lora_adapter", {"lora_name": "a1", "lora_path": str(path)})[0] == 400
    )
    bad = http(
        "POST", f"{srv.base}/load_lora_adapter", {"lora_name": "b", "lora_path": str(path.parent / "x")}
    )
    assert bad[0] == 400
    assert http("POST", f"{srv.base}/unload_lora_adapter", {"lora_name": "a1"})[0] == 200
    assert _complete(srv.base, "a1", prompt)[0] == 404
    assert http("POST", f"{srv.base}/unload_lora_adapter", {"lora_name": "a1"})[0] == 404
    _, again = _complete(srv.base, "tiny", prompt)
    assert again["choices"][0]["token_ids"] == base["choices"][0]["token_ids"]  # the base is itself again
    log = srv.log_text()
    assert "lora adapter loaded: a1" in log and "lora adapter unloaded: a1" in log


def test_server_engine_swaps_adapters_and_samples_each_context_apart(served, hf, adapter):
    """The `server` rollout engine: a batch of contexts greedy = the model's greedy tokens; after
    `swap_adapter` it generates with the adapter; sampled copies of one context get different seeds."""
    _, srv = served
    model, tok, stops = hf
    path, peft = adapter
    engine = ServerEngine(srv.base, None, None, 60.0, 4)
    assert engine.check() == "tiny"
    prompts = _prompts(tok)
    greedy = Draw(0.0, 1.0, 0, 0, tuple(stops))
    comps, lps = engine.generate(prompts, 10, greedy)
    assert comps == [_greedy(model, p, 10, stops)[0] for p in prompts]
    assert all(
        len(c) == len(lp) and all(math.isfinite(x) for x in lp) for c, lp in zip(comps, lps, strict=True)
    )
    engine.swap_adapter("run-step-0", str(path))
    engine.swap_adapter("run-step-1", str(path))  # the previous version is unloaded
    names = [m["id"] for m in http("GET", f"{srv.base}/models")[1]["data"]]
    assert "run-step-1" in names and "run-step-0" not in names
    comps, _ = engine.generate(prompts[:1], 10, greedy)
    assert comps[0] == _greedy(peft, prompts[0], 10, stops)[0]
    sampled, _ = engine.generate([prompts[0]] * 4, 10, Draw(1.5, 1.0, 0, 7, tuple(stops)))
    assert len({tuple(c) for c in sampled}) > 1
    engine.close()
    assert "run-step-1" not in [m["id"] for m in http("GET", f"{srv.base}/models")[1]["data"]]
