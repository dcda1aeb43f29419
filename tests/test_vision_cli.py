"""`pyengine run MODEL PROMPT --image PATH`: the image goes into the prompt, with the
projector beside the model or given by --mmproj; the reply is the library's."""

from __future__ import annotations

import shutil

from conftest import DATA

from pyengine import cli
from pyengine.api import LLM

VISION = DATA / "vision"
TEXT, MMPROJ, PNG = VISION / "gemma3-tiny.gguf", VISION / "gemma3-tiny.mmproj.gguf", VISION / "gemma3-tiny.png"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def library_reply(image: bytes | None) -> str:
    with LLM(TEXT, n_ctx=256, n_threads=1, mmproj=MMPROJ) as llm:
        reply = llm.chat([{"role": "user", "content": "describe this"}], images=[image] if image else None,
                         max_tokens=4, temperature=0)
    return reply["message"]["content"]


def test_run_with_an_image_beside_and_by_flag(capsys, tmp_path):
    expected = library_reply(PNG.read_bytes())
    code, out, err = run_cli(capsys, "run", str(TEXT), "describe this", "--image", str(PNG), "--max-tokens", "4",
                             "--ctx", "256", "--threads", "1")
    assert code == 0, err
    assert out.rstrip("\n") == expected.rstrip("\n")
    assert expected != library_reply(None)     # the image changed the answer
    model = tmp_path / "alone.gguf"
    shutil.copyfile(TEXT, model)
    code, _, err = run_cli(capsys, "run", str(model), "describe this", "--image", str(PNG), "--ctx", "256")
    assert code != 0 and "projector" in err
    code, out, err = run_cli(capsys, "run", str(model), "describe this", "--image", str(PNG), "--mmproj", str(MMPROJ),
                             "--max-tokens", "4", "--ctx", "256", "--threads", "1")
    assert code == 0, err
    assert out.rstrip("\n") == expected.rstrip("\n")


def test_run_refuses_a_missing_image_and_raw(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", str(TEXT), "x", "--image", str(tmp_path / "none.png"))
    assert code != 0 and "none.png" in err
    code, _, err = run_cli(capsys, "run", str(TEXT), "x", "--image", str(PNG), "--raw")
    assert code != 0 and "--raw" in err


def test_interactive_chat_takes_image_paths(tmp_path):
    import io

    from pyengine.repl import ChatRepl, images_in

    spaced = tmp_path / "my photo.png"
    shutil.copyfile(PNG, spaced)
    text, found = images_in(f"what is in '{spaced}' and {PNG}? not.png is no file")
    assert text == "what is in and ? not.png is no file" and [p for p, _ in found] == [str(spaced), str(PNG)]
    assert images_in("no images here") == ("no images here", [])
    script = iter([f"describe this {PNG}"])

    def read(prompt):
        try:
            return next(script)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    with LLM(TEXT, n_ctx=256, n_threads=1, mmproj=MMPROJ) as llm:
        repl = ChatRepl(llm, TEXT, {"temperature": 0, "num_predict": 4}, read=read, out=out)
        assert repl.run() == 0
    assert f"Added image '{PNG}'" in out.getvalue()
    assert repl.history[0] == {"role": "user", "content": "describe this", "images": [PNG.read_bytes()]}
    assert repl.history[1]["content"] == library_reply(PNG.read_bytes())
