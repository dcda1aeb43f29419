"""The interactive chat of ``pyengine run NAME`` on a terminal.

Each line is a user turn; the reply streams as it is generated and both are kept as
history for the next turn. Commands:

    /bye                         leave (Ctrl-D too)
    /clear                       forget the conversation so far
    /set parameter NAME VALUE    a sampling option by Ollama's name (temperature, top_k,
                                 num_predict, seed, stop, ...)
    /set system TEXT             a system prompt for the turns that follow
    /show info                   the model's architecture and sizes, and the parameters set
    /? or /help                  this list

A message can span lines when it is wrapped in triple quotes (\"\"\"). Ctrl-C stops a
reply that is being written. A path to an image file in a message (.png, .jpg, .jpeg,
.webp, .gif; quoted if it holds spaces) attaches that image, as Ollama's chat does.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

from pyengine.errors import ContextLengthError, InvalidOptionError, PyEngineError

HELP = """Available commands:
  /set parameter NAME VALUE   set a sampling option (temperature, top_k, top_p, num_predict, seed, stop, ...)
  /set system TEXT            set the system prompt
  /show info                  show the model's details and the parameters set
  /clear                      clear the conversation history
  /bye                        exit
  /?, /help                   show this help

Use \"\"\" to begin and end a message of several lines."""
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".gif")
# a quoted path, or a word less the punctuation after it ("see cat.png?")
_PATH_WORD = re.compile(r"'([^']+)'|\"([^\"]+)\"|(\S+?)([.,;:?!)]*)(?=\s|$)")


class ChatRepl:
    """A read-reply loop over `llm` with history (see the module docs)."""

    def __init__(self, llm: Any, model_path: Any, options: dict | None = None, *,
                 read: Callable[[str], str] = input, out: TextIO | None = None) -> None:
        self.llm = llm
        self.model_path = model_path
        self.options: dict[str, Any] = dict(options or {})
        self.history: list[dict] = []
        self.system: str | None = None
        self._read = read
        self.out = out if out is not None else sys.stdout

    # ---- the loop ------------------------------------------------------------------

    def run(self) -> int:
        self._say('Send a message (/? for help, /bye to exit)')
        while True:
            try:
                line = self._read_message()
            except EOFError:
                self._say("")
                return 0
            except KeyboardInterrupt:
                self._say("\nUse Ctrl + d or /bye to exit.")
                continue
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if self.command(text) == "exit":
                    return 0
                continue
            self.reply(line)

    def _read_message(self) -> str:
        line = self._read(">>> ")
        stripped = line.lstrip()
        if not stripped.startswith('"""'):
            return line
        rest = stripped[3:]
        if rest.rstrip().endswith('"""'):  # """a message on one line"""
            return rest.rstrip()[:-3]
        lines = [rest]
        while True:
            more = self._read("... ")
            if more.rstrip().endswith('"""'):
                lines.append(more.rstrip()[:-3])
                return "\n".join(lines).strip("\n")
            lines.append(more)

    # ---- commands --------------------------------------------------------------------

    def command(self, text: str) -> str | None:
        words = text.split()
        name = words[0].lower()
        if name in ("/bye", "/exit"):
            return "exit"
        if name in ("/?", "/help"):
            self._say(HELP)
        elif name == "/clear":
            self.history.clear()
            self._say("Cleared session context")
        elif name == "/set":
            self._set(text, words)
        elif name == "/show":
            self._show(words)
        else:
            self._say(f"Unknown command '{words[0]}'. Type /? for help")
        return None

    def _set(self, text: str, words: list[str]) -> None:
        if len(words) >= 2 and words[1] == "system":
            self.system = text.split(None, 2)[2] if len(words) > 2 else None
            self._say("Set system message." if self.system else "Cleared system message.")
            return
        if len(words) < 4 or words[1] != "parameter":
            self._say("Usage: /set parameter NAME VALUE  or  /set system TEXT")
            return
        name = words[2]
        value = parse_value(words[3]) if name != "stop" else words[3:]
        try:
            check_option(name, value)
        except InvalidOptionError as exc:
            self._say(f"error: {exc}")
            return
        self.options[name] = value
        self._say(f"Set parameter '{name}' to '{' '.join(words[3:])}'")

    def _show(self, words: list[str]) -> None:
        if len(words) < 2 or words[1] not in ("info", "parameters"):
            self._say("Usage: /show info  or  /show parameters")
            return
        if words[1] == "info":
            from pyengine.summary import model_summary

            rows = model_summary(self.model_path)
            width = max(len(label) for label, _ in rows)
            for label, value in rows:
                self._say(f"  {label.ljust(width)}  {value}")
        self._say("Parameters:" if self.options else "No parameters set.")
        for name, value in sorted(self.options.items()):
            self._say(f"  {name} {value}")

    # ---- replies --------------------------------------------------------------------

    def messages_for(self, text: str, images: list[bytes] | None = None) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.history + [user_turn(text, images)]

    def reply(self, text: str) -> None:
        from pyengine.session import chat

        stream = None
        content: list[str] = []
        text, images = images_in(text)
        for path, _ in images:
            self._say(f"Added image '{path}'")
        images = [data for _, data in images]
        try:
            stream = chat(self.llm, self.messages_for(text, images), stream=True, **self.options)
            thinking = False
            for chunk in stream:
                message = chunk["message"]
                if message.get("thinking"):
                    if not thinking:
                        self._write("Thinking...\n")
                        thinking = True
                    self._write(message["thinking"])
                if message.get("content"):
                    if thinking:
                        self._write("\n...done thinking.\n\n")
                        thinking = False
                    content.append(message["content"])
                    self._write(message["content"])
        except KeyboardInterrupt:
            if stream is not None:
                stream.close()  # stops the generation
            self._say("")
            return  # an interrupted turn is not kept
        except ContextLengthError as exc:
            self._say(f"error: {exc}. Use /clear to start over.")
            return
        except PyEngineError as exc:
            self._say(f"error: {exc}")
            return
        self._say("" if "".join(content).endswith("\n") else "\n")
        self.history += [user_turn(text, images), {"role": "assistant", "content": "".join(content)}]

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _say(self, text: str) -> None:
        self._write(text + "\n")


def user_turn(text: str, images: list[bytes] | None) -> dict:
    return {"role": "user", "content": text, **({"images": images} if images else {})}


def images_in(text: str) -> tuple[str, list[tuple[str, bytes]]]:
    """(the message without the image paths in it, [(path, bytes)] of those images): a
    word (or quoted words) naming an existing file with an image extension."""
    found: list[tuple[str, bytes]] = []

    def take(match: re.Match) -> str:
        word = next(group for group in match.groups()[:3] if group is not None)
        path = Path(word).expanduser()
        if not word.lower().endswith(IMAGE_EXTENSIONS) or not path.is_file():
            return match.group(0)
        try:
            found.append((word, path.read_bytes()))
        except OSError:
            return match.group(0)
        return match.group(4) or ""

    rest = _PATH_WORD.sub(take, text)
    return (re.sub(r"[ \t]{2,}", " ", rest).strip() if found else text), found


def parse_value(text: str) -> Any:
    """A parameter value typed at the prompt: an integer, a number, true/false, or text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_option(name: str, value: Any) -> None:
    """InvalidOptionError unless `name` is an option the chat takes with this value."""
    if name == "stop":
        if not value or not all(isinstance(item, str) for item in value):
            raise InvalidOptionError("stop takes one or more strings")
        return
    if name in ("num_predict", "num_ctx"):
        from pyengine.options import RequestOptions

        RequestOptions(**{"max_tokens" if name == "num_predict" else name: value})
        return
    from pyengine.sample import SamplingOptions

    SamplingOptions.from_dict({name: value})


def enable_line_editing() -> None:
    """Arrow keys and history in input() where the platform has readline."""
    try:
        import readline  # noqa: F401
    except ImportError:
        pass


__all__ = ["ChatRepl", "HELP", "check_option", "enable_line_editing", "parse_value"]
