"""Prompt formats for GGUFs without a chat template (pyengine.chat.renderers): each
renderer against its family's official template, the choice from architecture and
vocabulary, and the real Gemma-3-270M (no template in its file) chatting in Gemma's
turn markers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from pyengine import session
from pyengine.chat import renderers
from pyengine.chat.parsers import detect_tool_format
from pyengine.chat.prompt import model_template
from pyengine.chat.renderers import BY_NAME, select_renderer
from pyengine.chat.template import ChatTemplate
from pyengine.gguf import GGUFFile
from pyengine.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "templates_golden.json").read_text())
SPECIAL = GOLDEN["special"]
SCENARIOS = GOLDEN["scenarios"]
SYSTEM = {"role": "system", "content": "You are a terse assistant."}

# renderer -> (official template, scenarios its recorded transformers renders are compared on)
RECORDED = {
    "gemma": ("google-gemma-2-2b-it.jinja", ("user_only", "multi_turn", "no_generation_prompt", "tools", "unicode")),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct.jinja", tuple(SCENARIOS)),
    # Qwen 3's own template also writes an empty think block into a closing reply
    "chatml": ("Qwen-Qwen3-0.6B.jinja", tuple(s for s in SCENARIOS if s != "no_generation_prompt")),
    "granite": ("ibm-granite-granite-4.1.jinja", tuple(SCENARIOS)),
    "mistral-v7": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", ("system_user",)),
}
# renderer -> official templates that write a default system prompt when there is none:
# compared on every conversation with a system turn first (the official source rendered here)
WITH_SYSTEM = {
    "mistral-v7": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "unsloth-mistral-Devstral-Small-2507.jinja"),
    "chatml": ("Qwen-Qwen2.5-7B-Instruct.jinja",),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct.jinja",),
    "granite": ("ibm-granite-granite-4.1.jinja",),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja",),
}


def _bound(source_or_renderer) -> ChatTemplate:
    if isinstance(source_or_renderer, renderers.Renderer):
        return ChatTemplate.from_renderer(source_or_renderer, SPECIAL["bos_token"], SPECIAL["eos_token"])
    return ChatTemplate(source_or_renderer, SPECIAL["bos_token"], SPECIAL["eos_token"])


def _render(template: ChatTemplate, scenario: dict, messages: list | None = None) -> str:
    return template.render(messages or scenario["messages"], tools=scenario.get("tools"),
                           add_generation_prompt=scenario["add_generation_prompt"],
                           date_string=SPECIAL["date_string"])


@pytest.mark.parametrize(("name", "scenario"),
                         [(name, s) for name, (_, scenarios) in RECORDED.items() for s in scenarios])
def test_renderer_matches_the_recorded_official_render(name, scenario):
    official, _ = RECORDED[name]
    expected = GOLDEN["templates"][official]["renders"][scenario]["text"]
    assert _render(_bound(BY_NAME[name]), SCENARIOS[scenario]) == expected


@pytest.mark.parametrize(("name", "official", "scenario"),
                         [(name, official, s) for name, sources in WITH_SYSTEM.items() for official in sources
                          for s in SCENARIOS])
def test_renderer_matches_the_official_template_with_a_system_prompt(name, official, scenario):
    conversation = SCENARIOS[scenario]
    messages = conversation["messages"]
    if messages[0]["role"] != "system":
        messages = [SYSTEM, *messages]
    want = _render(_bound(GOLDEN["templates"][official]["source"]), conversation, messages)
    assert _render(_bound(BY_NAME[name]), conversation, messages) == want


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_smollm3_without_thinking_matches_its_template(scenario):
    """Reasoning switched off (enable_thinking false: empty think blocks, the short default
    instruction when there is no system prompt), every conversation as recorded."""
    conversation = SCENARIOS[scenario]
    official = _bound(GOLDEN["templates"]["HuggingFaceTB-SmolLM3-3B.jinja"]["source"])
    mine = _bound(BY_NAME["smollm3"])
    args = dict(tools=conversation.get("tools"), add_generation_prompt=conversation["add_generation_prompt"],
                enable_thinking=False)
    assert mine.render(conversation["messages"], **args) == official.render(conversation["messages"], **args)
    assert mine.supports_thinking


def test_gemma_folds_the_system_prompt_into_the_first_user_turn():
    """As Gemma 3's template does (Gemma 2's refuses a system turn)."""
    out = _render(_bound(BY_NAME["gemma"]), SCENARIOS["system_user"])
    assert out == ("<BOS><start_of_turn>user\nYou are a terse assistant.\n\nName three colors.<end_of_turn>\n"
                   "<start_of_turn>model\n")


# The formats the test data has no official template of, as their models' templates
# (and llama.cpp's built-in ones) write them: a system prompt, two user turns and a reply.
CONVERSATION = [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}]
WRITTEN = {
    "mistral": "<BOS>[INST] You are a terse assistant.\n\nHi[/INST] Hello.<EOS>[INST] Bye[/INST]",
    "llama2": ("<BOS>[INST] <<SYS>>\nYou are a terse assistant.\n<</SYS>>\n\nHi [/INST] Hello. <EOS>"
               "<BOS>[INST] Bye [/INST]"),
    "phi3": ("<|system|>\nYou are a terse assistant.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
             "<|user|>\nBye<|end|>\n<|assistant|>\n"),
    "phi4": ("<|im_start|>system<|im_sep|>You are a terse assistant.<|im_end|><|im_start|>user<|im_sep|>Hi"
             "<|im_end|><|im_start|>assistant<|im_sep|>Hello.<|im_end|><|im_start|>user<|im_sep|>Bye<|im_end|>"
             "<|im_start|>assistant<|im_sep|>"),
    "exaone4": ("[|system|]You are a terse assistant.[|endofturn|]\n[|user|]Hi\n[|assistant|]Hello.[|endofturn|]\n"
                "[|user|]Bye\n[|assistant|]"),
    "glm4": "[gMASK]<sop><|system|>\nYou are a terse assistant.<|user|>\nHi<|assistant|>\nHello.<|user|>\nBye<|assistant|>\n",
    "olmo2": ("<BOS><|system|>\nYou are a terse assistant.\n<|user|>\nHi\n<|assistant|>\nHello.<EOS>\n<|user|>\nBye\n"
              "<|assistant|>\n"),
    "hunyuan-dense": ("<｜hy_begin▁of▁sentence｜>You are a terse assistant.<｜hy_place▁holder▁no▁3｜><｜hy_User｜>Hi"
                      "<｜hy_Assistant｜>Hello.<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Bye<｜hy_Assistant｜>"),
    "gemma": ("<BOS><start_of_turn>user\nYou are a terse assistant.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
              "Hello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
}


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_renderer_writes_its_familys_turns(name):
    assert _bound(BY_NAME[name]).render(CONVERSATION) == WRITTEN[name]


def test_every_renderer_renders_every_conversation_and_stops_at_its_turn_markers():
    for renderer in renderers.RENDERERS:
        template = _bound(renderer)
        for conversation in SCENARIOS.values():
            assert isinstance(_render(template, conversation), str)
        assert renderer.stops and template.stops == renderer.stops and template.renderer == renderer.name


def test_tool_formats_are_the_ones_the_parsers_read():
    want = {"chatml": "hermes", "granite": "hermes", "llama3": "llama3", "mistral-v7": "mistral"}
    assert {name: detect_tool_format(BY_NAME[name].template) for name in want} == want
    assert detect_tool_format(BY_NAME["gemma"].template) is None   # Gemma's own templates show no tools


# --------------------------------------------------------------------------------------
# Choosing one
# --------------------------------------------------------------------------------------

LLAMA3_TOKENS = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>"}
V7_TOKENS = {"[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "<s>", "</s>"}
GEMMA_TOKENS = {"<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"}
CHATML_TOKENS = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}


@pytest.mark.parametrize(("architecture", "vocabulary", "want"), [
    ("gemma3", GEMMA_TOKENS, "gemma"),
    ("gemma2", GEMMA_TOKENS, "gemma"),
    ("llama", LLAMA3_TOKENS, "llama3"),
    ("llama", V7_TOKENS, "mistral-v7"),
    ("llama", {"[INST]", "[/INST]", "<s>", "</s>"}, "mistral"),
    ("llama", {"<s>", "</s>"}, "llama2"),
    ("llama", CHATML_TOKENS, "chatml"),          # SmolLM2 and other ChatML-trained llamas
    ("mistral3", V7_TOKENS, "mistral-v7"),
    ("phi3", {"<|user|>", "<|assistant|>", "<|end|>", "<|system|>"}, "phi3"),
    ("phi3", {"<|im_start|>", "<|im_sep|>", "<|im_end|>"}, "phi4"),
    ("qwen2", CHATML_TOKENS, "chatml"),
    ("granite", {"<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"}, "granite"),
    ("exaone4", {"[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]"}, "exaone4"),
    ("glm4", {"[gMASK]", "<sop>", "<|user|>", "<|assistant|>"}, "glm4"),
    ("olmo2", {"<|endoftext|>", "<|pad|>"}, "olmo2"),
    ("smollm3", CHATML_TOKENS, "smollm3"),
    ("hunyuan-dense", {"<｜hy_begin▁of▁sentence｜>", "<｜hy_User｜>", "<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁2｜>",
                       "<｜hy_place▁holder▁no▁3｜>"}, "hunyuan-dense"),
    ("hunyuan-dense", CHATML_TOKENS, "chatml"),
    ("ernie4_5", GEMMA_TOKENS, "gemma"),         # no format of its own here: the vocabulary's
    ("gemma3", CHATML_TOKENS, "chatml"),         # a family's format needs its tokens
])
def test_selection_from_architecture_and_vocabulary(architecture, vocabulary, want):
    assert select_renderer(architecture, vocabulary).name == want


def test_chatml_is_the_last_resort():
    renderer = select_renderer("gemma2", {"<s>", "</s>"})
    assert renderer is renderers.FALLBACK and renderer.name == "chatml"
    assert ChatTemplate.fallback().stops == ("<|im_end|>", "<|im_start|>")


def test_the_selection_is_one_table():
    """Every architecture the renderers name is a key of the table, not a branch in code."""
    source = Path(renderers.__file__).read_text()
    assert "architecture ==" not in source and "arch ==" not in source
    assert len({renderer.name for renderer in renderers.RENDERERS}) == len(renderers.RENDERERS)


@pytest.mark.parametrize(("file", "want"), [
    ("phi3-q5_0.gguf", "phi3"),
    ("qwen2-q8_0.gguf", "chatml"),
    ("llama-spm-q4_0.gguf", "llama2"),
    ("llama-bpe-q5_1-tied.gguf", "chatml"),
    ("olmo2-q8_0.gguf", "olmo2"),
    ("smollm3-q8_0.gguf", "smollm3"),
    ("glm4-q8_0.gguf", "chatml"),     # SmolLM's vocabulary under GLM-4's blocks: ChatML's tokens, not GLM's
])
def test_synthetic_files_without_templates(file, want):
    """The file's metadata and the loaded tokenizer choose alike."""
    with GGUFFile(DATA / "synth" / file) as gguf:
        assert renderers.file_renderer(gguf.metadata).name == want
        template = model_template(gguf, Tokenizer.from_gguf(gguf))
    assert template.renderer == want and template.stops == BY_NAME[want].stops


def test_a_file_with_a_template_has_no_renderer():
    assert renderers.file_renderer({"tokenizer.chat_template": "{{ messages }}",
                                    "general.architecture": "gemma3"}) is None


# --------------------------------------------------------------------------------------
# The real Gemma-3-270M
# --------------------------------------------------------------------------------------

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def gemma(gemma3_path):
    from pyengine.api import LLM

    with LLM(str(gemma3_path), n_ctx=512, n_parallel=1) as llm:
        yield llm


def test_gemma3_chats_in_its_own_turns(gemma):
    prepared = session.prepare_chat(gemma, [SYSTEM, *QUESTION])
    assert prepared.text == ("<bos><start_of_turn>user\nYou are a terse assistant.\n\nWhat is 2+2?<end_of_turn>\n"
                             "<start_of_turn>model\n")
    assert prepared.ids[0] == gemma.tokenizer.bos_id and prepared.ids.count(gemma.tokenizer.bos_id) == 1
    assert gemma.tokenize("<start_of_turn>", add_special=False, parse_special=True)[0] in prepared.ids
    assert prepared.stops == ("<end_of_turn>", "<start_of_turn>")
    # the base model answers poorly in any format, but in Gemma's: no ChatML tags come back
    reply = gemma.chat(QUESTION, num_predict=40, temperature=0)
    content = reply["message"]["content"]
    assert content.strip() and "<|im_" not in content and "<start_of_turn>" not in content


def test_gemma3_show_names_the_renderer(gemma3_path):
    from pyengine.server import ServerConfig
    from server_support import running_server

    with running_server(ServerConfig(parallel=1, n_ctx=512)) as server:
        shown = httpx.post(server.url + "/api/show", json={"model": "gemma3-270m"}, timeout=60).json()
        assert shown["renderer"] == "gemma" and "<start_of_turn>" in shown["template"]
        assert "im_start" not in shown["template"]
        reply = httpx.post(server.url + "/api/chat", timeout=120, json={
            "model": "gemma3-270m", "messages": QUESTION, "stream": False,
            "options": {"temperature": 0, "num_predict": 40}}).json()
        assert reply["message"]["content"].strip() and "<|im_" not in reply["message"]["content"]


def test_show_on_the_command_line_names_the_format(gemma3_path):
    from pyengine.summary import model_summary

    assert dict(model_summary(gemma3_path))["chat template"] == "no (prompted in the gemma format)"
