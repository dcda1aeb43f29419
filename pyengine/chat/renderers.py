"""Prompt formats for models whose GGUF carries no chat template.

A file without ``tokenizer.chat_template`` is rendered with its family's own turn
format, as Ollama's renderers and llama.cpp's built-in templates do, not with a
format the model has never seen. Each format is one :class:`Renderer` in the table
:data:`RENDERERS`: a Jinja template (rendered through the same sandbox as a file's own
template, so messages, tools and limits are handled alike), the texts that end a reply
(its turn markers, applied beside the request's stops), the vocabulary entries it
needs, and the ``general.architecture`` values it is native to.

:func:`select_renderer` takes the first renderer native to the architecture whose
tokens the vocabulary has (so a ``llama`` file with Llama 3's header tokens gets Llama
3's headers, one with ``[INST]`` control tokens Mistral's, one with neither Llama 2's);
failing that the first renderer marked ``by_vocabulary`` whose tokens are there (a
vocabulary with ``<|im_start|>`` gets ChatML whatever its architecture); and ChatML
as the last resort, its tags then written as plain text.

The templates follow each family's official one (checked against the real templates
in tests/data/templates_golden.json where the test data has them), without the
official ones' refusals: roles need not alternate and a system turn is never an error.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Shared macros: the text of a content (a string or a list of text parts) and one tool
# call as JSON with its arguments under `key` ("arguments", or Llama 3's "parameters").
_PRELUDE = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content -%}
    {%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro call_json(call, key) -%}
  {%- set fn = call.function if call.function is defined else call -%}
  {{- '{"name": ' + fn.name | tojson + ', "' + key + '": ' -}}
  {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}' -}}
{%- endmacro -%}
"""


@dataclass(frozen=True)
class Renderer:
    """One family's prompt format."""

    name: str
    template: str                          # Jinja source (the prelude's macros included)
    stops: tuple[str, ...]                 # texts that end a reply: the format's turn markers
    tokens: tuple[str, ...] = ()           # vocabulary entries the format needs
    architectures: frozenset[str] = frozenset()
    by_vocabulary: bool = False            # chosen for any architecture whose vocabulary has `tokens`

    def fits(self, vocabulary: Container[str]) -> bool:
        return all(token in vocabulary for token in self.tokens)


def _renderer(name: str, body: str, stops: tuple[str, ...], tokens: tuple[str, ...] = (),
              architectures: tuple[str, ...] = (), by_vocabulary: bool = False) -> Renderer:
    return Renderer(name, _PRELUDE + body.strip() + "\n", stops, tokens, frozenset(architectures), by_vocabulary)


# ChatML with tools in Hermes' form, as Qwen 2.5 / Qwen 3 write them (no default system prompt).
_CHATML = r"""
{%- set system_first = messages and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if system_first -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
      'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + tool | tojson -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
      '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
      '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_first -%}
  {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and system_first -%}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' + text(message.content) -}}
    {%- for call in message.tool_calls or [] -%}
      {%- if not loop.first or message.content -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n' + call_json(call, 'arguments') + '\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# Gemma (1, 2, 3): user and model turns only; system text opens the next user turn, as
# Gemma 3's template folds it into the first; tool results are user turns.
_GEMMA = r"""
{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- set ns.system = ns.system + text(message.content) + '\n\n' -%}
  {%- else -%}
    {%- set role = 'model' if message.role == 'assistant' else 'user' -%}
    {{- '<start_of_turn>' + role + '\n' -}}
    {%- if role == 'user' -%}{{- ns.system -}}{%- set ns.system = '' -%}{%- endif -%}
    {{- text(message.content) | trim + '<end_of_turn>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""

# Llama 3.1's headers: a system header with the dates, tools (JSON with "parameters")
# offered in the first user turn, tool results as ipython turns.
_LLAMA3 = r"""
{{- bos_token -}}
{%- set today = date_string if date_string is defined else '26 Jul 2024' -%}
{%- set ns = namespace(system='', rest=messages, tools_offered=false) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = text(messages[0].content) | trim -%}
  {%- set ns.rest = messages[1:] -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: ' + today + '\n\n' + ns.system + '<|eot_id|>' -}}
{%- if tools -%}
  {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
  {{- 'Given the following functions, please respond with a JSON for a function call with its proper '
      'arguments that best answers the given prompt.\n\n' -}}
  {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
      'value}.Do not use variables.\n\n' -}}
  {%- for tool in tools -%}{{- tool | tojson(indent=4) + '\n\n' -}}{%- endfor -%}
  {%- if ns.rest and ns.rest[0].role == 'user' -%}
    {{- text(ns.rest[0].content) | trim -}}
    {%- set ns.rest = ns.rest[1:] -%}
  {%- endif -%}
  {{- '<|eot_id|>' -}}
{%- endif -%}
{%- for message in ns.rest -%}
  {%- if message.role == 'tool' -%}
    {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content | tojson + '<|eot_id|>' -}}
  {%- elif message.tool_calls -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
    {%- for call in message.tool_calls -%}
      {%- if not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- call_json(call, 'parameters') -}}
    {%- endfor -%}
    {{- '<|eot_id|>' -}}
  {%- else -%}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + text(message.content) | trim -}}
    {{- '<|eot_id|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""

# Mistral's v7 "tekken" form (Mistral Small 3, Ministral 3, Devstral): system prompts in
# [SYSTEM_PROMPT], tools in [AVAILABLE_TOOLS], calls as [TOOL_CALLS]name[ARGS]{...}.
_MISTRAL_V7 = r"""
{{- bos_token -}}
{%- set ns = namespace(rest=messages) -%}
{%- if messages and messages[0].role == 'system' -%}
  {{- '[SYSTEM_PROMPT]' + text(messages[0].content) + '[/SYSTEM_PROMPT]' -}}
  {%- set ns.rest = messages[1:] -%}
{%- endif -%}
{%- if tools -%}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}
{%- for message in ns.rest -%}
  {%- if message.role == 'user' -%}
    {{- '[INST]' + text(message.content) + '[/INST]' -}}
  {%- elif message.role == 'system' -%}
    {{- '[SYSTEM_PROMPT]' + text(message.content) + '[/SYSTEM_PROMPT]' -}}
  {%- elif message.role == 'tool' -%}
    {{- '[TOOL_RESULTS]' + text(message.content) + '[/TOOL_RESULTS]' -}}
  {%- else -%}
    {{- text(message.content) -}}
    {%- for call in message.tool_calls or [] -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '[TOOL_CALLS]' + fn.name + '[ARGS]' + (fn.arguments if fn.arguments is string else fn.arguments | tojson) -}}
    {%- endfor -%}
    {{- eos_token -}}
  {%- endif -%}
{%- endfor -%}
"""

# Mistral's v3 form (Mistral 7B Instruct v0.3 and kin, [INST] as control tokens): the
# system text opens the next user turn.
_MISTRAL = r"""
{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- set ns.system = ns.system + text(message.content) + '\n\n' -%}
  {%- elif message.role == 'assistant' -%}
    {{- ' ' + text(message.content) | trim + eos_token -}}
  {%- else -%}
    {{- '[INST] ' + ns.system + text(message.content) + '[/INST]' -}}
    {%- set ns.system = '' -%}
  {%- endif -%}
{%- endfor -%}
"""

# Llama 2 chat: the system prompt in <<SYS>> inside the first [INST], BOS before every
# user turn, EOS after every reply.
_LLAMA2 = r"""
{%- set ns = namespace(system='', first=true) -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- set ns.system = ns.system + text(message.content) -%}
  {%- elif message.role == 'assistant' -%}
    {{- ' ' + text(message.content) | trim + ' ' + eos_token -}}
  {%- else -%}
    {%- set content = text(message.content) -%}
    {%- if ns.first and ns.system -%}
      {%- set content = '<<SYS>>\n' + ns.system + '\n<</SYS>>\n\n' + content -%}
    {%- endif -%}
    {%- set ns.first = false -%}
    {{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}
  {%- endif -%}
{%- endfor -%}
"""

# Phi-3 / Phi-3.5: <|role|> headers, turns closed by <|end|>.
_PHI3 = r"""
{%- for message in messages -%}
  {%- set role = 'user' if message.role == 'tool' else message.role -%}
  {{- '<|' + role + '|>\n' + text(message.content) + '<|end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}
"""

# Phi-4 (architecture phi3): ChatML's tags with <|im_sep|> after the role.
_PHI4 = r"""
{%- for message in messages -%}
  {%- set role = 'user' if message.role == 'tool' else message.role -%}
  {{- '<|im_start|>' + role + '<|im_sep|>' + text(message.content) + '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant<|im_sep|>' -}}{%- endif -%}
"""

# IBM Granite 3.x / 4.x: role markers, turns closed by <|end_of_text|>; tools in Hermes'
# form as Granite 4.1 offers them.
_GRANITE = r"""
{%- set system_first = messages and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|start_of_role|>system<|end_of_role|>' -}}
  {%- if system_first -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
  {{- 'You are a helpful assistant with access to the following tools. You may call one or more tools to '
      'assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML '
      'tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + tool | tojson -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each tool call, return a json object with function name and arguments within '
      '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
      '<args-json-object>}\n</tool_call>. If a tool does not exist in the provided list of tools, notify the '
      'user that you do not have the ability to fulfill the request.<|end_of_text|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and system_first and tools -%}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|start_of_role|>user<|end_of_role|>' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|end_of_text|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + text(message.content) -}}
    {%- for call in message.tool_calls or [] -%}
      {%- if not loop.first or message.content -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n' + call_json(call, 'arguments') + '\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|end_of_text|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}{%- endif -%}
"""

# EXAONE 4, as llama.cpp's built-in exaone4 format writes it.
_EXAONE4 = r"""
{%- for message in messages -%}
  {%- set content = text(message.content) | trim -%}
  {%- if message.role == 'system' -%}{{- '[|system|]' + content + '[|endofturn|]\n' -}}
  {%- elif message.role == 'user' -%}{{- '[|user|]' + content + '\n' -}}
  {%- elif message.role == 'assistant' -%}{{- '[|assistant|]' + content + '[|endofturn|]\n' -}}
  {%- else -%}{{- '[|tool|]' + content + '[|endofturn|]\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '[|assistant|]' -}}{%- endif -%}
"""

# GLM-4 (0414) and ChatGLM 4: [gMASK]<sop>, then <|role|> headers.
_GLM4 = r"""
{{- '[gMASK]<sop>' -}}
{%- for message in messages -%}
  {%- set role = 'observation' if message.role == 'tool' else message.role -%}
  {{- '<|' + role + '|>\n' + text(message.content) -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}
"""

# OLMo 2 (Tülu 3's format): <|role|> lines, replies closed by EOS.
_OLMO2 = r"""
{{- bos_token -}}
{%- for message in messages -%}
  {%- set role = 'user' if message.role == 'tool' else message.role -%}
  {%- if role == 'assistant' -%}
    {{- '<|assistant|>\n' + text(message.content) + eos_token + ('' if loop.last else '\n') -}}
  {%- else -%}
    {{- '<|' + role + '|>\n' + text(message.content) + '\n' -}}
  {%- endif -%}
  {%- if loop.last and add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}
{%- endfor -%}
"""

# SmolLM3: ChatML under a metadata system block that names the reasoning mode
# (enable_thinking, or /think and /no_think in the system prompt); without a system
# prompt the short default instruction. Tools are not shown, as in its GGUF template.
_SMOLLM3 = r"""
{%- set ns = namespace(mode='/think' if (enable_thinking is not defined or enable_thinking) else '/no_think',
                       custom='') -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- if '/no_think' in system -%}{%- set ns.mode = '/no_think' -%}
  {%- elif '/think' in system -%}{%- set ns.mode = '/think' -%}{%- endif -%}
  {%- set ns.custom = system.replace('/no_think', '').replace('/think', '').rstrip() -%}
{%- endif -%}
{%- set empty_think = '' if ns.mode == '/think' else '<think>\n\n</think>\n' -%}
{{- '<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: ' + ns.mode + '\n\n'
    '## Custom Instructions\n\n' -}}
{{- (ns.custom or 'You are a helpful AI assistant named SmolLM, trained by Hugging Face.') + '\n\n<|im_end|>\n' -}}
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' + empty_think + text(message.content).lstrip('\n') + '<|im_end|>\n' -}}
  {%- elif message.role != 'system' -%}
    {{- '<|im_start|>user\n' + text(message.content) + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' + empty_think -}}{%- endif -%}
"""

# Hunyuan dense (Hunyuan-4B and kin), as llama.cpp's built-in hunyuan-dense format writes it.
_HUNYUAN_DENSE = r"""
{%- for message in messages -%}
  {%- if loop.first -%}
    {{- '<｜hy_begin▁of▁sentence｜>' -}}
    {%- if message.role == 'system' -%}{{- text(message.content) + '<｜hy_place▁holder▁no▁3｜>' -}}{%- endif -%}
  {%- endif -%}
  {%- if message.role == 'assistant' -%}
    {{- '<｜hy_Assistant｜>' + text(message.content) + '<｜hy_place▁holder▁no▁2｜>' -}}
  {%- elif message.role != 'system' -%}
    {{- '<｜hy_User｜>' + text(message.content) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜hy_Assistant｜>' -}}{%- else -%}{{- '<｜hy_place▁holder▁no▁8｜>' -}}{%- endif -%}
"""

CHATML = _renderer("chatml", _CHATML, ("<|im_end|>", "<|im_start|>"), ("<|im_start|>", "<|im_end|>"),
                   ("qwen2", "qwen2moe", "qwen3", "qwen3moe"), by_vocabulary=True)

# In order of preference: within an architecture the first whose tokens the vocabulary
# has wins, so the more specific formats of a family come first.
RENDERERS: tuple[Renderer, ...] = (
    _renderer("gemma", _GEMMA, ("<end_of_turn>", "<start_of_turn>"), ("<start_of_turn>", "<end_of_turn>"),
              ("gemma", "gemma2", "gemma3", "gemma3n"), by_vocabulary=True),
    _renderer("llama3", _LLAMA3, ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"),
              ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), ("llama",), by_vocabulary=True),
    _renderer("mistral-v7", _MISTRAL_V7, ("[INST]", "[SYSTEM_PROMPT]"),
              ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"), ("llama", "mistral", "mistral3"),
              by_vocabulary=True),
    _renderer("mistral", _MISTRAL, ("[INST]",), ("[INST]", "[/INST]"), ("llama", "mistral", "mistral3"),
              by_vocabulary=True),
    _renderer("phi4", _PHI4, ("<|im_end|>", "<|im_start|>"), ("<|im_start|>", "<|im_sep|>", "<|im_end|>"),
              ("phi3",), by_vocabulary=True),
    _renderer("phi3", _PHI3, ("<|end|>", "<|user|>", "<|assistant|>", "<|system|>"),
              ("<|user|>", "<|assistant|>", "<|end|>"), ("phi3",), by_vocabulary=True),
    _renderer("granite", _GRANITE, ("<|end_of_text|>", "<|start_of_role|>"),
              ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"), ("granite", "granitemoe"),
              by_vocabulary=True),
    _renderer("exaone4", _EXAONE4, ("[|endofturn|]", "[|user|]"),
              ("[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]"), ("exaone4",), by_vocabulary=True),
    _renderer("glm4", _GLM4, ("<|user|>", "<|observation|>"), ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>"),
              ("glm4", "chatglm"), by_vocabulary=True),
    _renderer("hunyuan-dense", _HUNYUAN_DENSE, ("<｜hy_place▁holder▁no▁2｜>", "<｜hy_User｜>"),
              ("<｜hy_begin▁of▁sentence｜>", "<｜hy_User｜>", "<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁2｜>",
               "<｜hy_place▁holder▁no▁3｜>"), ("hunyuan-dense",), by_vocabulary=True),
    _renderer("smollm3", _SMOLLM3, ("<|im_end|>", "<|im_start|>"), ("<|im_start|>", "<|im_end|>"), ("smollm3",)),
    CHATML,
    # formats written in ordinary text: chosen by architecture only
    _renderer("olmo2", _OLMO2, ("<|user|>", "<|system|>"), ("<|endoftext|>",), ("olmo2",)),
    _renderer("llama2", _LLAMA2, ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"), ("<s>", "</s>"), ("llama",)),
)

# The last resort: ChatML whatever the vocabulary (its tags may then be plain text).
FALLBACK = Renderer("chatml", CHATML.template, CHATML.stops)

BY_NAME: dict[str, Renderer] = {renderer.name: renderer for renderer in RENDERERS}


def select_renderer(architecture: str, vocabulary: Container[str]) -> Renderer:
    """The prompt format for a model of `architecture` whose vocabulary holds the token
    texts in `vocabulary` (see the module docs for the order)."""
    for renderer in RENDERERS:
        if architecture in renderer.architectures and renderer.fits(vocabulary):
            return renderer
    for renderer in RENDERERS:
        if renderer.by_vocabulary and renderer.fits(vocabulary):
            return renderer
    return FALLBACK


def file_renderer(metadata: Mapping[str, Any]) -> Renderer | None:
    """The renderer a GGUF's metadata calls for: None when the file has its own chat
    template, else the one :func:`select_renderer` picks from its architecture and its
    vocabulary (``tokenizer.ggml.tokens``)."""
    if metadata.get("tokenizer.chat_template"):
        return None
    architecture = metadata.get("general.architecture")
    tokens = metadata.get("tokenizer.ggml.tokens")
    return select_renderer(architecture if isinstance(architecture, str) else "",
                           known_tokens(tokens if tokens is not None else ()))


def known_tokens(vocabulary: Iterable[str]) -> frozenset[str]:
    """The token texts any renderer asks for that `vocabulary` holds (one pass over it)."""
    wanted = _WANTED
    return frozenset(token for token in vocabulary if token in wanted)


_WANTED = frozenset(token for renderer in RENDERERS for token in renderer.tokens)


__all__ = ["BY_NAME", "CHATML", "FALLBACK", "RENDERERS", "Renderer", "file_renderer", "known_tokens",
           "select_renderer"]
