"""Every stored fuzz input (tests/data/fuzz/<surface>/seeds/ and crashes/) replayed through
its harness (fuzz/harnesses.py), without atheris: none may show a defect again.

The crashes/ folders keep every input a fuzzer ever failed on (scripts/fuzz.sh writes them);
each was fixed at its cause, and this keeps it fixed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOME = os.environ.get("PYENGINE_HOME")
sys.path.insert(0, str(ROOT / "fuzz"))
import harnesses  # noqa: E402

INPUTS = sorted(path for surface in harnesses.SURFACES
                for kind in ("seeds", "crashes")
                for path in (harnesses.FUZZ_DATA / surface / kind).glob("*") if path.is_file())


def test_every_surface_has_seeds():
    for surface in harnesses.SURFACES:
        assert list((harnesses.FUZZ_DATA / surface / "seeds").iterdir()), surface


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_stored_input_shows_no_defect(path):
    harnesses.HARNESSES[path.parent.parent.name](path.read_bytes())


def test_a_harness_reports_a_defect(monkeypatch):
    """The harnesses can fail: a one-shot parse that loses text differs from the streamed one."""
    from pyengine.chat import parsers

    real = parsers.parse_output
    monkeypatch.setattr(parsers, "parse_output", lambda text, **kw: real(text[:-1], **kw))
    with pytest.raises(harnesses.Defect, match="streamed"):
        harnesses.one_parsers(b"\0\0plain text")


def test_the_server_harness_keeps_its_store_to_itself():
    """Its /api/create writes go to a private store only while it handles a request: the
    tests run after it find their models where they were (PYENGINE_HOME unchanged)."""
    harnesses.one_server(bytes([harnesses.ROUTES.index("/api/create")]) + b'{"model": "x", "from": "fake"}')
    assert os.environ.get("PYENGINE_HOME") == HOME


def test_the_server_harness_reaches_the_routes():
    """Its requests get past the app's host and origin checks to the handlers: a chat with
    the fake model is answered."""
    response = harnesses.server_response(bytes([harnesses.ROUTES.index("/api/chat")])
                                         + b'{"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "stream": false}')
    assert response.status_code == 200, response.text
    assert response.json()["message"]["role"] == "assistant"


def test_the_bound_counts_cpu_time_not_waiting(monkeypatch):
    """A slow input is one that works long (a loaded machine's wall clock is no measure);
    under atheris the bound allows for the instrumentation's slowdown."""
    import time

    monkeypatch.setattr(harnesses, "SLOW_S", 0.05)
    with harnesses._bounded("waiting"):
        time.sleep(0.2)
    with pytest.raises(harnesses.Defect, match="working"):
        with harnesses._bounded("working"):
            end = time.process_time() + 0.2
            while time.process_time() < end:
                pass
    monkeypatch.setattr(harnesses, "SLOWDOWN", 10.0)
    with harnesses._bounded("working, instrumented"):
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass


def test_the_fuzz_run_keeps_a_failing_input(tmp_path):
    """fuzz/run.py writes the input a harness raised on itself (libFuzzer's own write was
    lost when its alarm killed the process mid-report)."""
    import hashlib

    import run

    def failing(data):
        raise harnesses.Defect("found")

    with pytest.raises(harnesses.Defect):
        run.keeping_failures(failing, f"{tmp_path}/")(b"input")
    assert (tmp_path / f"crash-{hashlib.sha1(b'input').hexdigest()}").read_bytes() == b"input"
