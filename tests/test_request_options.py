"""RequestOptions: one object per request, built by one constructor per dialect."""

from __future__ import annotations

import dataclasses

import pytest

from pyengine.errors import InvalidOptionError
from pyengine.options import FILL_CONTEXT, RequestOptions, context_limit

SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
            "presence_penalty", "frequency_penalty")


def _sampling(options: RequestOptions) -> dict:
    return {name: getattr(options.sampling, name) for name in SAMPLING}


def test_each_dialect_has_its_own_defaults():
    ollama = RequestOptions.from_ollama({})
    assert _sampling(ollama) == {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "typical_p": 1.0,
                                 "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0,
                                 "frequency_penalty": 0.0}
    assert ollama.max_tokens is None       # Ollama's num_predict -1: no limit of its own
    openai = RequestOptions.from_openai({"model": "m", "messages": [], "stream": True})
    assert _sampling(openai)["temperature"] == 1.0
    assert (openai.sampling.top_k, openai.sampling.top_p, openai.sampling.min_p) == (0, 1.0, 0.0)
    assert openai.max_tokens is None
    completion = RequestOptions.from_llama_cpp({})
    assert (completion.sampling.temperature, completion.sampling.top_k, completion.sampling.top_p,
            completion.sampling.min_p) == (0.8, 40, 0.95, 0.05)
    assert completion.max_tokens == 128
    chat = RequestOptions.from_llama_cpp({}, chat=True)
    assert chat.sampling.temperature == 0.2 and chat.max_tokens is None
    for options in (ollama, openai, completion, chat):
        assert (options.num_ctx, options.num_keep, options.shift, options.truncate, options.stop,
                options.logprobs, options.cache_prompt) == (None, 4, True, False, (), False, True)


def test_the_model_file_and_a_created_model_layer_under_the_request():
    model = {"temperature": 0.375, "top_k": 7}
    created = {"top_k": 3, "num_ctx": 64, "stop": ["\n"]}
    options = RequestOptions.from_ollama({"top_p": 0.5}, model=model, created=created)
    assert (options.sampling.temperature, options.sampling.top_k, options.sampling.top_p) == (0.375, 3, 0.5)
    assert options.num_ctx == 64 and options.stop == ("\n",)
    assert RequestOptions.from_ollama({"num_ctx": 32}, created=created).num_ctx == 32


def test_the_same_request_through_the_three_dialects_is_equal():
    ollama = RequestOptions.from_ollama({"temperature": 0.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                         "seed": 7, "stop": ["END"], "num_predict": 32, "num_ctx": 128,
                                         "presence_penalty": 0.25})
    openai = RequestOptions.from_openai({"model": "m", "temperature": 0.5, "seed": 7, "stop": "END",
                                         "max_tokens": 32, "num_ctx": 128, "presence_penalty": 0.25})
    llama_cpp = RequestOptions.from_llama_cpp({"temperature": 0.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                               "seed": 7, "stop": ["END"], "max_tokens": 32, "num_ctx": 128,
                                               "presence_penalty": 0.25})
    assert ollama == openai == llama_cpp
    assert ollama.max_tokens == 32 and ollama.sampling.seed == 7


def test_openai_names_map_to_the_same_fields():
    assert RequestOptions.from_openai({"max_completion_tokens": 9}).max_tokens == 9
    with pytest.raises(InvalidOptionError, match="max_completion_tokens"):
        RequestOptions.from_openai({"max_tokens": 9, "max_completion_tokens": 9})
    top = RequestOptions.from_openai({"logprobs": True, "top_logprobs": 3})
    assert (top.logprobs, top.top_logprobs) == (True, 3)
    assert RequestOptions.from_llama_cpp({"mirostat_mode": 2}).sampling.mirostat == 2
    assert RequestOptions.from_llama_cpp({"logprobs": 5}).top_logprobs == 5   # its int logprobs: the top count


@pytest.mark.parametrize("build", [
    lambda: RequestOptions.from_ollama({"temprature": 0.5}),
    lambda: RequestOptions.from_openai({"best_temperature": 0.5}),
    lambda: RequestOptions.from_llama_cpp({"no_such_option": 1}),
])
def test_unknown_options_are_refused_by_name(build):
    with pytest.raises(InvalidOptionError, match="unknown sampling option"):
        build()


def test_llama_cpp_python_keywords_that_change_nothing_here_are_accepted():
    assert RequestOptions.from_llama_cpp({"echo": False, "stream": True, "tfs_z": 1.0}) == \
        RequestOptions.from_llama_cpp({})


@pytest.mark.parametrize("options, name", [
    ({"temperature": -1}, "temperature"),
    ({"top_k": "many"}, "top_k"),
    ({"num_predict": -3}, "num_predict"),
    ({"num_predict": True}, "num_predict"),
    ({"num_ctx": 0}, "num_ctx"),
    ({"num_keep": -2}, "num_keep"),
    ({"shift": "yes"}, "shift"),
    ({"truncate": 1}, "truncate"),
    ({"stop": [1]}, "stop"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"grammar": 3}, "grammar"),
])
def test_a_bad_value_raises_naming_the_option(options, name):
    with pytest.raises(InvalidOptionError, match=name):
        RequestOptions.from_ollama(options)


def test_grammar_and_format_are_exclusive():
    with pytest.raises(InvalidOptionError, match="not both"):
        RequestOptions.from_ollama({"grammar": 'root ::= "a"', "format": "json"})
    assert RequestOptions.from_ollama({"format": "json"}).grammar is not None


def test_the_object_is_frozen_and_normalised():
    options = RequestOptions.from_ollama({"stop": "x", "num_predict": -2, "num_ctx": 16.0})
    assert options.stop == ("x",) and options.max_tokens == FILL_CONTEXT and options.num_ctx == 16
    assert RequestOptions.from_ollama({"num_predict": -1}).max_tokens is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_ctx = 8


def test_context_limit_is_checked_against_the_loaded_context():
    assert context_limit(256) == 256
    assert context_limit(256, 100) == 100
    with pytest.raises(InvalidOptionError, match="larger than the context"):
        context_limit(256, 300)
    with pytest.raises(InvalidOptionError, match="num_ctx"):
        context_limit(256, "big")
