"""The chat page at ``GET /``: served to browsers only, under a strict Content-Security-Policy,
and driven in a real headless Chromium (Debian's chromium and chromedriver; .ci/run installs
them): a scripted fake model checks the Markdown, the collapsed thinking, that markup in a
reply stays text, the settings, the history and the errors; SmolLM2 checks that replies
stream and that Stop ends a generation and frees its slot."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from pyengine.chat.parsers import Delta
from pyengine.session import ChatPiece, ChatResult
from pyengine.errors import ModelError
from pyengine.server import ServerConfig
from server_support import FakeAdapter, fake_loader, running_server, wait_for

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
KEY = "page-test-key"
LAN_HOST = "chat.pyengine.test"  # the browser resolves it to 127.0.0.1
SYNTH_MODEL = Path(__file__).parent / "data" / "synth" / "llama-f16.gguf"
FAKE = "scripted"
FAKE_TAG = "scripted:latest"  # /api/tags names carry their tag
THINKING = "Let me think about <b>this</b>."
REPLY = (
    "Here is **bold** and *slanted* and `x<y`.\n\n"
    "```python\nprint('<hi>')\n```\n\n"
    "- one\n- two\n\n"
    "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"> "
    "[bad](javascript:window.pwned=3) [good](https://example.com/) or https://example.com/raw."
)


# --------------------------------------------------------------------------------------
# A fake model that streams fixed thinking and reply text, and records what it was asked
# --------------------------------------------------------------------------------------


@dataclass
class ScriptedRun:
    deltas: list[Delta]
    delay_s: float
    fail_with: Exception | None
    cancelled: bool = False
    result: ChatResult | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self._events()

    async def _events(self):
        for delta in self.deltas:
            await asyncio.sleep(self.delay_s)
            if self.cancelled:
                break
            yield ChatPiece((delta,))
            if self.fail_with is not None:
                raise self.fail_with
        content = "".join(d.text for d in self.deltas if d.kind == "content")
        self.result = ChatResult(content=content, reasoning=THINKING, tool_calls=[], finish_reason="stop",
                                 prompt_tokens=3, completion_tokens=len(self.deltas))
        yield self.result


class ScriptedAdapter(FakeAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict] = []

    def start_chat(self, messages, **kwargs) -> ScriptedRun:
        self.requests.append({"messages": messages, **kwargs})
        pieces = [Delta("reasoning", THINKING[:10]), Delta("reasoning", THINKING[10:])]
        pieces += [Delta("content", REPLY[n:n + 24]) for n in range(0, len(REPLY), 24)]
        return ScriptedRun(pieces, 0.02, self.fail_with)


# --------------------------------------------------------------------------------------
# Headless Chromium
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, "needs Debian's chromium and chromium-driver (apt-get install; .ci/run does)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,900",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking",
                     f"--host-resolver-rules=MAP {LAN_HOST} 127.0.0.1"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The system chromedriver: Selenium's own manager never downloads anything.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver, condition, timeout: float = 10.0, message: str = ""):
    # An element read while the page redraws the reply can go stale between two calls: read again.
    wait = WebDriverWait(driver, timeout, poll_frequency=0.02, ignored_exceptions=(StaleElementReferenceException,))
    return wait.until(lambda d: condition(), message)


def csp_violations(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def last_reply(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]


def reply_text(driver) -> str:
    return last_reply(driver).find_element(By.CSS_SELECTOR, ".content").text


def type_setting(driver, element_id: str, value: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(value, Keys.TAB)  # the change event stores it


def send_message(driver, text: str) -> None:
    driver.find_element(By.ID, "prompt").send_keys(text, Keys.ENTER)


def idle(driver) -> bool:
    return (driver.find_element(By.ID, "send").is_enabled()
            and not driver.find_element(By.ID, "stop").is_displayed())


# --------------------------------------------------------------------------------------
# What the server sends (no browser)
# --------------------------------------------------------------------------------------


def test_browsers_get_the_page_and_programs_the_text():
    adapter = ScriptedAdapter()
    with running_server(ServerConfig(api_key=KEY), loader=fake_loader(adapter), served={FAKE: SYNTH_MODEL}) as server, \
            httpx.Client(base_url=server.url, timeout=10) as http:
        page = http.get("/", headers={"Accept": BROWSER_ACCEPT})  # no key: the page holds no secrets
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
        assert "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff" and "accept" in page.headers["vary"].lower()
        scripts = re.findall(r"<script[^>]*>", page.text)
        assert scripts and all('src="/static/' in tag for tag in scripts)  # no inline script
        assert "<script" not in re.sub(r"<script[^>]*></script>", "", page.text)
        head = http.head("/", headers={"Accept": "text/html"})
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/html") and head.content == b""

        for accept in (None, "*/*", "application/json", "text/html;q=0, */*"):
            probe = http.get("/", headers={"Accept": accept} if accept else {})
            assert (probe.status_code, probe.text) == (200, "pyengine is running")
            assert probe.headers["content-type"].startswith("text/plain")

        for path, kind in (("/static/chat.js", "text/javascript"), ("/static/chat.css", "text/css")):
            asset = http.get(path)
            assert asset.status_code == 200 and asset.headers["content-type"] == f"{kind}; charset=utf-8"
            assert asset.headers["x-content-type-options"] == "nosniff" and len(asset.content) > 1000
        for path in ("/static/index.html", "/static/nope.js", "/static/../page.py", "/static/%2e%2e/page.py"):
            assert http.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 404, path
        assert http.get("/api/tags").status_code == 401  # the API itself still needs the key


# --------------------------------------------------------------------------------------
# In the browser, with the scripted model
# --------------------------------------------------------------------------------------


def test_page_renders_markdown_safely_keeps_history_and_shows_errors(browser):
    # As on a LAN address with a key: the page's own origin (not a loopback one) may call the API.
    adapter = ScriptedAdapter()
    config = ServerConfig(host=LAN_HOST, api_key=KEY)
    with running_server(config, loader=fake_loader(adapter), served={FAKE: SYNTH_MODEL}) as server:
        browser.get(f"http://{LAN_HOST}:{server.port}/")
        # The server wants a key: the page says so and opens its settings; with the key, the models come.
        until(browser, lambda: browser.find_element(By.ID, "error").is_displayed())
        assert "API key" in browser.find_element(By.ID, "error-text").text
        assert browser.find_element(By.ID, "settings").is_displayed()
        type_setting(browser, "api-key", KEY)
        until(browser, lambda: FAKE_TAG in [o.text for o in Select(browser.find_element(By.ID, "model")).options])
        Select(browser.find_element(By.ID, "model")).select_by_visible_text(FAKE_TAG)
        assert not browser.find_element(By.ID, "error").is_displayed()
        type_setting(browser, "system", "Be brief.")
        type_setting(browser, "temperature", "0.3")

        send_message(browser, "Show me some markdown")
        until(browser, lambda: idle(browser) and "raw." in reply_text(browser))
        reply = last_reply(browser)
        content = reply.find_element(By.CSS_SELECTOR, ".content")
        assert [e.text for e in content.find_elements(By.TAG_NAME, "strong")] == ["bold"]
        assert [e.text for e in content.find_elements(By.TAG_NAME, "em")] == ["slanted"]
        assert "x<y" in [e.text for e in content.find_elements(By.CSS_SELECTOR, "p code")]
        assert content.find_element(By.CSS_SELECTOR, "pre > code.language-python").text == "print('<hi>')"
        assert [e.text for e in content.find_elements(By.CSS_SELECTOR, "ul > li")] == ["one", "two"]
        # Markup in the reply is shown as text and never runs; only the http(s) link is a link.
        assert content.find_elements(By.CSS_SELECTOR, "script, img, b") == []
        assert "<script>window.pwned = 1</script>" in content.text and "[bad](javascript:" in content.text
        assert browser.execute_script("return window.pwned") is None
        links = content.find_elements(By.TAG_NAME, "a")
        assert [(a.text, a.get_attribute("href")) for a in links] == [
            ("good", "https://example.com/"), ("https://example.com/raw", "https://example.com/raw")]
        assert all("noopener" in a.get_attribute("rel") for a in links)
        # The thinking is there, collapsed, as text.
        thinking = reply.find_element(By.CSS_SELECTOR, "details.thinking")
        assert thinking.is_displayed() and thinking.get_attribute("open") is None
        assert browser.execute_script("return arguments[0].querySelector('.thinking-text').textContent",
                                      thinking) == THINKING
        assert "tokens" in reply.find_element(By.CSS_SELECTOR, ".meta").text

        # The second turn carries the system prompt and the whole conversation; temperature in options.
        send_message(browser, "Again")
        until(browser, lambda: idle(browser) and len(adapter.requests) == 2 and "raw." in reply_text(browser))
        first, second = adapter.requests
        assert first["options"]["temperature"] == 0.3
        assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
        assert second["messages"][0]["content"] == "Be brief." and second["messages"][2]["content"] == REPLY
        assert second["messages"][3]["content"] == "Again"

        # A reply that fails mid-stream: the error is shown and the message goes back into the box.
        adapter.fail_with = ModelError("the model fell over")
        send_message(browser, "Once more")
        until(browser, lambda: idle(browser) and browser.find_element(By.ID, "error").is_displayed())
        assert "the model fell over" in browser.find_element(By.ID, "error-text").text
        assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Once more"
        assert "failed" in last_reply(browser).get_attribute("class")
        # Sent again, the failed turn is not in the history twice; "New chat" forgets it all.
        adapter.fail_with = None
        send_message(browser, "")
        until(browser, lambda: idle(browser) and len(adapter.requests) == 4)
        assert [m["content"] for m in adapter.requests[3]["messages"]][-3:] == ["Again", REPLY, "Once more"]
        browser.find_element(By.ID, "new-chat").click()
        assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
        send_message(browser, "Fresh start")
        until(browser, lambda: idle(browser) and len(adapter.requests) == 5)
        assert [m["role"] for m in adapter.requests[4]["messages"]] == ["system", "user"]
        assert csp_violations(browser) == []


# --------------------------------------------------------------------------------------
# In the browser, with SmolLM2: streaming and Stop
# --------------------------------------------------------------------------------------

MODEL = "smollm2-135m"
MODEL_TAG = "smollm2-135m:latest"


def test_page_streams_and_stop_frees_the_slot(browser, smollm2_path):
    with running_server(ServerConfig(), served={MODEL: smollm2_path}) as server:
        browser.get(server.url + "/")
        until(browser, lambda: MODEL_TAG in [o.text for o in Select(browser.find_element(By.ID, "model")).options])
        Select(browser.find_element(By.ID, "model")).select_by_visible_text(MODEL_TAG)
        browser.find_element(By.ID, "settings-toggle").click()
        type_setting(browser, "temperature", "0")
        type_setting(browser, "max-tokens", "2000")

        send_message(browser, "Count from 1 to 500, one number per line.")
        until(browser, lambda: len(reply_text(browser)) > 0, timeout=20)
        seen = [len(reply_text(browser))]
        until(browser, lambda: len(reply_text(browser)) > seen[0] + 10)  # it grows: streamed
        seen.append(len(reply_text(browser)))
        assert browser.find_element(By.ID, "stop").is_displayed()
        entry = server.state.registry.get_loaded(MODEL)
        assert entry.active == 1 and entry.adapter.stats()["live"] == 1

        browser.find_element(By.ID, "stop").click()
        until(browser, lambda: idle(browser))
        stopped_text = reply_text(browser)
        assert wait_for(lambda: entry.active == 0 and entry.adapter.stats()["live"] == 0, timeout=5)
        time.sleep(0.3)
        assert reply_text(browser) == stopped_text and len(stopped_text) > 10  # nothing more came
        assert last_reply(browser).find_element(By.CSS_SELECTOR, ".meta").text == "stopped"
        assert browser.find_element(By.ID, "status").text == "stopped"

        # The slot is free: the next turn (with the stopped reply in its history) is answered.
        type_setting(browser, "max-tokens", "5")
        send_message(browser, "Thanks")
        until(browser, lambda: idle(browser) and len(browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2,
              timeout=20)
        assert "5 tokens" in last_reply(browser).find_element(By.CSS_SELECTOR, ".meta").text
        assert not browser.find_element(By.ID, "error").is_displayed()
        assert csp_violations(browser) == []
