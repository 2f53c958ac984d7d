"""Chat templates: the Qwen3 ones read from TRL's vendored files (without importing TRL, which takes seconds),
and named built-ins for models whose own template does not render tools.

`qwen3` is stored as the tokenizer's chat template of the from-scratch presets (byte-identical, so TRL
recognises it for tool-call parsing). `qwen3_training` is TRL's prefix-preserving variant with
`{% generation %}` markers: our rollout loop and SFT render with it, so a conversation's prompt at turn t is
an exact prefix of its full rendering (what the model sees when acting = what it is trained on), and TRL's
GRPO tool loop uses the same one.

Built-ins (`chat_template:` of `trace model import`): `qwen3` (= TRL's, with `<think>` blocks), `hermes`
(ChatML with Hermes `<tool_call>` JSON, no thinking block: SmolLM2, Qwen2.5, Hermes) and `llama3-json`
(Llama 3.1 JSON tool calls, `<|eot_id|>` turns). Every built-in is prefix-preserving and marks the assistant's
tokens with `{% generation %}`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path


def _trl_dir() -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trl is not installed; it provides the Qwen3 chat templates")
    return Path(list(spec.submodule_search_locations)[0])


@cache
def qwen3_template() -> str:
    return (_trl_dir() / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")


@cache
def qwen3_training_template() -> str:
    return (_trl_dir() / "chat_templates" / "qwen3_training.jinja").read_text(encoding="utf-8")


TRAINING_TEMPLATE_FILE = "chat_template_training.jinja"

_TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_FORMAT = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call>"
)


def _conversation(
    *,
    head: tuple[str, str],
    end: str,
    after: str,
    call: tuple[str, str, str],
    tool: tuple[str, str, str],
) -> str:
    """The message loop every built-in shares, in one family's markers: a message is `head[0] ROLE head[1]`,
    its content and `end` (+ `after`, outside the assistant's `{% generation %}` span); an assistant turn is
    its content, then each tool call as `call[0]` NAME `", "call[1]": ` ARGUMENTS `call[2]`; a tool result is
    shown under role `tool[0]`, wrapped in `tool[1]` ... `tool[2]`; last comes the generation prompt."""
    (h0, h1), (c0, key, c1), (role, t0, t1) = head, call, tool
    close = "{{- '\\n' }}\n" if after else ""
    return f"""{{%- for message in messages %}}
{{%- set content = message.content if message.content is string else '' %}}
{{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}}
{{{{- '{h0}' + message.role + '{h1}' + content + '{end}{after}' }}}}
{{%- elif message.role == 'assistant' %}}
{{{{- '{h0}assistant{h1}' }}}}
{{%- generation %}}
{{{{- content }}}}
{{%- for tool_call in message.tool_calls or [] %}}
{{%- if (loop.first and content) or not loop.first %}}{{{{- '\\n' }}}}{{%- endif %}}
{{%- if tool_call.function %}}{{%- set tool_call = tool_call.function %}}{{%- endif %}}
{{{{- '{c0}{{"name": "' + tool_call.name + '", "{key}": ' }}}}
{{%- if tool_call.arguments is string %}}{{{{- tool_call.arguments }}}}{{%- else %}}{{{{- tool_call.arguments | tojson }}}}{{%- endif %}}
{{{{- '}}{c1}' }}}}
{{%- endfor %}}
{{{{- '{end}' }}}}
{{%- endgeneration %}}
{close}{{%- elif message.role == 'tool' %}}
{{{{- '{h0}{role}{h1}{t0}' + content + '{t1}{end}{after}' }}}}
{{%- endif %}}
{{%- endfor %}}
{{%- if add_generation_prompt %}}{{{{- '{h0}assistant{h1}' }}}}{{%- endif %}}
"""


HERMES = (
    """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- \""""
    + _TOOLS_PREAMBLE
    + """\" }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- \""""
    + _TOOLS_FORMAT
    + """<|im_end|>\\n\" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
"""
    + _conversation(
        head=("<|im_start|>", "\\n"),
        end="<|im_end|>",
        after="\\n",
        call=("<tool_call>\\n", "arguments", "\\n</tool_call>"),
        tool=("tool", "<tool_response>\\n", "\\n</tool_response>"),
    )
)

LLAMA3_JSON = """{%- set sys = messages[0].content if messages[0].role == 'system' else '' %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + sys }}
{%- if tools %}
{{- '\\n\\nYou have access to the following functions. To call a function, respond with JSON for a function call '
    'in the form {\"name\": function name, \"parameters\": dictionary of argument name and its value}. '
    'Do not use variables.' }}
{%- for tool in tools %}{{- '\\n\\n' }}{{- tool | tojson }}{%- endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
""" + _conversation(
    head=("<|start_header_id|>", "<|end_header_id|>\\n\\n"),
    end="<|eot_id|>",
    after="",
    call=("", "parameters", ""),
    tool=("ipython", "", ""),
)


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    tool_format: str  # the parser of its tool calls (models.toolcalls)
    end_token: str  # ends every assistant turn: must be a stop token of the model


BUILTINS: dict[str, BuiltinTemplate] = {
    "qwen3": BuiltinTemplate("qwen3", "hermes", "<|im_end|>"),
    "hermes": BuiltinTemplate("hermes", "hermes", "<|im_end|>"),
    "llama3-json": BuiltinTemplate("llama3-json", "llama3-json", "<|eot_id|>"),
}


def builtin_text(name: str) -> str:
    """The template stored with a model that uses built-in `name` (qwen3: TRL's original, as the presets)."""
    return {"qwen3": qwen3_template, "hermes": lambda: HERMES, "llama3-json": lambda: LLAMA3_JSON}[name]()


def detect_tool_format(template: str | None) -> str:
    """The tool-call format a chat template teaches, from its markup (hermes when nothing else matches)."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or "ipython" in t or '"parameters"' in t:
        return "llama3-json"
    if "[func_name" in t or "pythonic" in t.lower():
        return "pythonic"
    return "hermes"
