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
