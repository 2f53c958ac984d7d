"""Tool-call formats per model family (Hermes, Llama-3 JSON, Mistral, pythonic), each with a tokenizer built offline:
the completion goes through encode/decode as a model's output would; the built-in templates render tools, are
prefix-preserving and end turns with a stop token."""

from __future__ import annotations

import pytest

from trace_cli.models.chat import eos_ids, prefix_problems, render
from trace_cli.models.templates import BUILTINS, LLAMA3_JSON, builtin_text, detect_tool_format
from trace_cli.models.toolcalls import parse

CORPUS = [
    'get_order_details {"name": "x", "parameters": {"order_id": "#W1"}} hello user assistant system tool',
    "cancel_pending_order(order_id='#W2', reason='no longer needed') [1, 2] true false null",
] * 20


def _tokenizer(specials: list[str], eos: str, pad: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token=eos, pad_token=pad)


@pytest.fixture(scope="module")
def llama_tok():
    tok = _tokenizer(
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
        "<|eot_id|>",
        "<|begin_of_text|>",
    )
    tok.chat_template = LLAMA3_JSON
    return tok


@pytest.fixture(scope="module")
def mistral_tok():
    return _tokenizer(["<s>", "</s>", "[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]"], "</s>", "<s>")


def _model_output(tok, text: str) -> str:
    """What a policy hands the parser: the decoded completion ids (special tokens kept)."""
    return tok.decode(tok(text, add_special_tokens=False)["input_ids"], skip_special_tokens=False)


def test_hermes_ours_and_transformers_response_parsing():
    import tinymodel  # noqa: F401 - tests/models is on sys.path
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    from trace_cli.models.builder import build_tokenizer

    tok = build_tokenizer(CORPUS, 600)
    text = (
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call><|im_end|>'
    )
    want = [{"name": "get_order_details", "arguments": {"order_id": "#W1"}}]
    assert parse(_model_output(tok, text), "hermes") == want
    assert getattr(tok, "response_template", None) is None
    add_response_schema(tok)  # TRL sets transformers' own parser for the Qwen3 template
    assert tok.response_template is not None
    got = parse(_model_output(tok, text), "hermes", tok)
    assert [a for a in got if "name" in a] == want
    assert AutoTokenizer  # imported for parity with the other formats


def test_llama3_json(llama_tok):
    out = _model_output(
        llama_tok, '{"name": "get_order_details", "parameters": {"order_id": "#W1"}}<|eot_id|>'
    )
    assert parse(out, "llama3-json") == [
        {"content": ""},
        {"name": "get_order_details", "arguments": {"order_id": "#W1"}},
    ]
    tagged = _model_output(
        llama_tok, '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"a": 1}}'
    )
    assert [a.get("name") for a in parse(tagged, "llama3-json")] == [None, "f", "g"]
    assert parse("Your order has shipped.<|eot_id|>", "llama3-json") == [
        {"content": "Your order has shipped."}
    ]
    bad = parse('{"name": "f", "parameters": {"a": }', "llama3-json")
    assert "malformed" in bad[1] and "JSON" in bad[1]["error"]


def test_llama3_json_template_renders_tools_preserves_prefixes_and_stops(llama_tok):
    from trace_cli.envs.corpus import sample_episodes
    from trace_cli.models.importer import renders_tools

    assert renders_tools(llama_tok, llama_tok.chat_template)
    assert detect_tool_format(LLAMA3_JSON) == "llama3-json"
    eps = sample_episodes(["shop"], 2)
    assert prefix_problems(llama_tok, eps) == []
    text = render(llama_tok, eps[0]["messages"], eps[0]["tools"], add_generation_prompt=False)
    assert '"parameters": {' in text and "<|start_header_id|>ipython<|end_header_id|>" in text
    end = llama_tok.convert_tokens_to_ids(BUILTINS["llama3-json"].end_token)
    assert end in eos_ids(llama_tok)


def test_mistral(mistral_tok):
    v3 = _model_output(
        mistral_tok, '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]</s>'
    )
    assert parse(v3, "mistral")[1:] == [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]
    v11 = _model_output(mistral_tok, 'Let me check.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}</s>')
    assert parse(v11, "mistral") == [
        {"content": "Let me check."},
        {"name": "f", "arguments": {"a": 1}},
        {"name": "g", "arguments": {}},
    ]
    assert parse("Hello!</s>", "mistral") == [{"content": "Hello!"}]
    assert "malformed" in parse("[TOOL_CALLS][{bad json", "mistral")[1]


def test_pythonic():
    got = parse(
        "[cancel_pending_order(order_id='#W2', reason='no longer needed'), get_user(id=3)]", "pythonic"
    )
    assert got[1:] == [
        {"name": "cancel_pending_order", "arguments": {"order_id": "#W2", "reason": "no longer needed"}},
        {"name": "get_user", "arguments": {"id": 3}},
    ]
    assert parse("I cannot help with that.", "pythonic") == [{"content": "I cannot help with that."}]
    assert "malformed" in parse("[f(x)]", "pythonic")[1]  # positional arguments have no names
    assert "malformed" in parse("[f(a=open('x'))]", "pythonic")[1]  # only literals


def test_non_hermes_turn_is_recorded_without_markup():
    """The rollout keeps what the agent said outside its calls, never the call markup, as the message text."""
    from trace_cli.agents.base import text_turn
    from trace_cli.envs.registry import make_env
    from trace_cli.envs.rollout import apply_actions, start

    st = start(make_env("shop"), 0)
    raw = '{"name": "find_user_id_by_email", "parameters": {"email": "a@b.c"}}'
    apply_actions(st, text_turn(raw, lambda t: parse(t, "llama3-json")), max_turns=5)
    msg = st.messages[-2]
    assert msg["role"] == "assistant" and msg["content"] == ""
    assert msg["tool_calls"][0]["function"]["name"] == "find_user_id_by_email"


def test_stop_tokens_come_from_tokenizer_and_generation_config(mistral_tok):
    from transformers import GenerationConfig

    eos = mistral_tok.convert_tokens_to_ids("</s>")
    extra = mistral_tok.convert_tokens_to_ids("[INST]")
    assert eos_ids(mistral_tok) == [eos]
    assert eos_ids(mistral_tok, GenerationConfig(eos_token_id=[eos, extra])) == sorted({eos, extra})


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_marks_the_assistant_turn(name):
    from trace_cli.models.chat import has_generation_marks, template_for

    class Tok:
        chat_template = builtin_text(name)

    assert has_generation_marks(template_for(Tok()))  # qwen3 trains with TRL's training variant
    assert not has_generation_marks("{% if add_generation_prompt %}x{% endif %}")


def test_sft_mask_without_generation_marks(llama_tok):
    """A model's own template without `{% generation %}`: the mask comes from prefix differences and covers
    exactly the assistant's tokens through its stop token."""
    import re

    from trace_cli.envs.corpus import sample_episodes
    from trace_cli.training.sft import tokenize

    plain = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", LLAMA3_JSON)
    ep = sample_episodes(["shop"], 1)[0]
    llama_tok.chat_template = plain
    try:
        [(ids, labels)] = tokenize(llama_tok, [ep], None)
    finally:
        llama_tok.chat_template = LLAMA3_JSON
    [(ids2, labels2)] = tokenize(llama_tok, [ep], None)  # the marked template: the reference mask
    assert ids == ids2 and labels == labels2
