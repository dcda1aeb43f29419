"""`pyengine run NAME` with no prompt on a terminal: the interactive chat, driven
through a pseudo-terminal, and its command loop driven directly."""

from __future__ import annotations

import io
import sys

import pexpect
import pytest
from conftest import CHILD_CWD, child_env

from pyengine.errors import InvalidOptionError
from pyengine.repl import ChatRepl, check_option, parse_value



def test_interactive_chat_in_a_terminal(smollm2_path):
    child = pexpect.spawn(sys.executable, ["-m", "pyengine", "run", "smollm2-135m", "--max-tokens", "8"],
                          cwd=CHILD_CWD, env=child_env(TERM="dumb"), encoding="utf-8", timeout=120, dimensions=(40, 200))
    try:
        child.expect_exact(">>> ")
        child.sendline("What is the capital of France?")
        child.expect_exact(">>> ")
        answer = child.before.split("France?", 1)[-1].strip()
        assert answer, "the model answered nothing"
        child.sendline("/set parameter temperature 0.3")
        child.expect_exact("Set parameter 'temperature' to '0.3'")
        child.sendline("/set parameter top_k lots")
        child.expect("error: .*top_k")
        child.sendline("/show info")
        child.expect_exact("architecture")
        child.expect_exact("temperature 0.3")
        child.sendline("/clear")
        child.expect_exact("Cleared session context")
        child.sendline("/nonsense")
        child.expect_exact("Unknown command '/nonsense'")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


@pytest.fixture(scope="module")
def llm(smollm2_path):
    from pyengine.api import LLM

    return LLM(str(smollm2_path), n_ctx=512)


def drive(llm, lines, options=None):
    """Run the loop over scripted input lines; (exit status, output, the repl)."""
    script = iter(lines)

    def read(prompt):
        try:
            return next(script)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    repl = ChatRepl(llm, llm.path, {"temperature": 0, "num_predict": 4, **(options or {})}, read=read, out=out)
    return repl.run(), out.getvalue(), repl


def test_history_is_kept_and_cleared(llm):
    code, out, repl = drive(llm, ["Hello!", "What did I just say?"])
    assert code == 0
    assert [m["role"] for m in repl.history] == ["user", "assistant", "user", "assistant"]
    assert repl.history[0]["content"] == "Hello!" and repl.history[1]["content"]
    assert repl.history[1]["content"] in out
    messages = repl.messages_for("next")
    assert [m["content"] for m in messages[:3]] == ["Hello!", repl.history[1]["content"], "What did I just say?"]
    code, out, repl = drive(llm, ["Hello!", "/clear", "Hi again"])
    assert "Cleared session context" in out
    assert [m["content"] for m in repl.history if m["role"] == "user"] == ["Hi again"]


def test_commands(llm):
    code, out, repl = drive(llm, [
        "/?", "/set parameter seed 42", "/set parameter stop END STOP", "/set parameter num_predict x",
        "/set system You are terse.", "/set", "/show parameters", '"""first line', "second line\"\"\"", "/bye",
        "never read",
    ])
    assert code == 0
    assert "/set parameter NAME VALUE" in out
    assert repl.options["seed"] == 42 and repl.options["stop"] == ["END", "STOP"]
    assert "error: option 'num_predict'" in out and repl.options["num_predict"] == 4
    assert repl.system == "You are terse." and "Usage: /set" in out
    assert "seed 42" in out
    assert repl.history[0]["content"] == "first line\nsecond line"
    assert repl.messages_for("x")[0] == {"role": "system", "content": "You are terse."}


def test_errors_do_not_end_the_chat(llm):
    code, out, repl = drive(llm, ["word " * 600, "Hi"])
    assert code == 0
    assert "error:" in out and "/clear" in out  # the context was too small for the first one
    assert [m["content"] for m in repl.history if m["role"] == "user"] == ["Hi"]


def test_values_and_options():
    assert parse_value("3") == 3 and parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_value("hello") == "hello"
    check_option("temperature", 0.7)
    check_option("num_predict", -1)
    check_option("stop", ["a"])
    for name, value in (("temperature", -1), ("num_ctx", 0), ("stop", []), ("bogus", 1), ("top_k", "x")):
        with pytest.raises(InvalidOptionError):
            check_option(name, value)
