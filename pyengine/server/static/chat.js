// The chat page: a model picker from /api/tags, replies streamed from /api/chat (NDJSON),
// rendered as Markdown. No libraries and no build step. Model text never goes through
// innerHTML: the Markdown renderer below builds DOM nodes and puts every piece of text
// into a text node, so markup in a reply (<script>, <img onerror=...>) shows as text.
"use strict";

// --------------------------------------------------------------------------------------
// Markdown: text -> DOM nodes (paragraphs, headings, fenced code, lists, quotes, tables,
// rules; inline code, bold, italic, strikethrough, links)
// --------------------------------------------------------------------------------------

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:\s+(.*))?$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const LINK_SCHEMES = /^(https?:|mailto:)/i;

function el(tag, className, children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (children !== undefined) node.append(...[].concat(children));  // strings become text nodes
  return node;
}

function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  appendBlocks(fragment, text.replace(/\r\n?/g, "\n").split("\n"));
  return fragment;
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    (LIST_ITEM.test(line) && LIST_ITEM.exec(line)[3] !== undefined) || isTableStart(lines, i);
}

function appendBlocks(parent, lines) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let match;
    if (!line.trim()) {
      i++;
    } else if ((match = FENCE.exec(line))) {
      i = appendCode(parent, lines, i, match);
    } else if ((match = HEADING.exec(line))) {
      parent.append(el("h" + match[1].length, null, inline(match[2])));
      i++;
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      i = appendQuote(parent, lines, i);
    } else if (LIST_ITEM.test(line)) {
      i = appendList(parent, lines, i);
    } else if (isTableStart(lines, i)) {
      i = appendTable(parent, lines, i);
    } else {
      i = appendParagraph(parent, lines, i);
    }
  }
}

function appendCode(parent, lines, start, match) {
  const fence = match[1];
  const body = [];
  let i = start + 1;
  while (i < lines.length && !isClosingFence(lines[i], fence)) body.push(lines[i++]);
  const code = el("code", match[2] ? "language-" + match[2] : null, body.join("\n"));
  parent.append(el("pre", null, code));
  return i + 1;  // past the closing fence, or past the end while the block is still streaming
}

function isClosingFence(line, fence) {
  const text = line.trim();
  return text.length >= fence.length && text[0] === fence[0] && /^(`+|~+)$/.test(text);
}

function appendQuote(parent, lines, start) {
  const body = [];
  let i = start;
  for (let match; i < lines.length && (match = QUOTE.exec(lines[i])); i++) body.push(match[1]);
  const quote = el("blockquote");
  appendBlocks(quote, body);
  parent.append(quote);
  return i;
}

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function appendList(parent, lines, start) {
  const first = LIST_ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  const items = [];
  let loose = false;
  let i = start;
  while (i < lines.length) {
    const match = LIST_ITEM.exec(lines[i]);
    if (!match || match[1].length !== indent || /\d/.test(match[2]) !== ordered) break;
    const contentIndent = indent + match[2].length + 1;
    const item = [match[3] || ""];
    for (i++; i < lines.length; i++) {
      const line = lines[i];
      if (!line.trim()) {
        const next = lines[i + 1];
        if (next === undefined || !next.trim() || indentOf(next) <= indent) break;
        item.push("");
        loose = true;
      } else if (indentOf(line) > indent) {
        item.push(line.slice(Math.min(indentOf(line), contentIndent)));
      } else if (startsBlock(lines, i)) {
        break;
      } else {
        item.push(line.trim());  // a lazy continuation of the item's paragraph
      }
    }
    items.push(item);
    let next = i;
    while (next < lines.length && !lines[next].trim()) next++;
    const after = next < lines.length && LIST_ITEM.exec(lines[next]);
    if (next > i && after && after[1].length === indent && /\d/.test(after[2]) === ordered) {
      loose = true;
      i = next;
    }
  }
  for (const item of items) {
    const li = el("li");
    appendBlocks(li, item);
    if (!loose) {
      for (const p of [...li.children].filter((child) => child.tagName === "P")) p.replaceWith(...p.childNodes);
    }
    list.append(li);
  }
  parent.append(list);
  return i;
}

function isTableStart(lines, i) {
  return i + 1 < lines.length && lines[i].includes("|") && lines[i + 1].includes("|") &&
    lines[i + 1].includes("-") && TABLE_RULE.test(lines[i + 1]);
}

function tableCells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function appendTable(parent, lines, start) {
  const aligns = tableCells(lines[start + 1]).map((cell) =>
    cell.endsWith(":") ? (cell.startsWith(":") ? "center" : "right") : (cell.startsWith(":") ? "left" : ""));
  const row = (line, tag) => {
    const tr = el("tr");
    tableCells(line).slice(0, aligns.length).forEach((cell, n) => {
      const td = el(tag, null, inline(cell));
      if (aligns[n]) td.style.textAlign = aligns[n];
      tr.append(td);
    });
    return tr;
  };
  const body = el("tbody");
  let i = start + 2;
  for (; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) body.append(row(lines[i], "td"));
  parent.append(el("table", null, [el("thead", null, row(lines[start], "th")), body]));
  return i;
}

function appendParagraph(parent, lines, start) {
  const body = [lines[start].trim()];
  let i = start + 1;
  for (; i < lines.length && lines[i].trim() && !startsBlock(lines, i); i++) body.push(lines[i].trim());
  parent.append(el("p", null, inline(body.join("\n"))));
  return i;
}

// Inline spans, tried in order wherever one of their first characters appears. Sticky
// (y) patterns match at a position without copying the rest of the text.
const INLINE_RULES = [
  [/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/y, (m) => el("code", null, m[2].replace(/^ ([\s\S]*) $/, "$1"))],
  [/\\([!-/:-@[-`{-~])/y, (m) => m[1]],
  [/\*\*(?=\S)([\s\S]*?\S)\*\*/y, (m, inLink) => el("strong", null, inline(m[1], inLink))],
  [/__(?=\S)([\s\S]*?\S)__(?!\w)/y, (m, inLink) => el("strong", null, inline(m[1], inLink)), "word-start"],
  [/~~(?=\S)([\s\S]*?\S)~~/y, (m, inLink) => el("del", null, inline(m[1], inLink))],
  [/\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/y, (m, inLink) => el("em", null, inline(m[1], inLink))],
  [/_(?=\S)([\s\S]*?\S)_(?!\w)/y, (m, inLink) => el("em", null, inline(m[1], inLink)), "word-start"],
  [/\[([^\]\n]*)\]\(\s*<?([^\s<>()]*(?:\([^\s<>()]*\)[^\s<>()]*)*)>?(?:\s+"[^"\n]*")?\s*\)/y,
    (m) => link(inline(m[1], true), m[2], m[0]), "link"],
  [/<((?:https?|mailto):[^\s<>]+)>/y, (m) => link(m[1], m[1], m[0]), "link"],
  [/https?:\/\/[^\s<>]*[^\s<>.,:;!?"'()[\]*_~]/y, (m) => link(m[0], m[0], m[0]), "link word-start"],
  [/\n/y, () => el("br")],
];
const INLINE_STARTS = "`\\*_~[<h\n";

// `inLink`: inside a link's label, where no further links are made.
function inline(text, inLink = false) {
  const out = [];
  let plain = "";
  let i = 0;
  while (i < text.length) {
    let node = null;
    let length = 0;
    if (INLINE_STARTS.includes(text[i])) {
      for (const [pattern, make, where = ""] of INLINE_RULES) {
        if (where.includes("word-start") && i > 0 && /\w/.test(text[i - 1])) continue;
        if (where.includes("link") && inLink) continue;
        pattern.lastIndex = i;
        const match = pattern.exec(text);
        if (match) {
          node = make(match, inLink);
          length = match[0].length;
          break;
        }
      }
    }
    if (node === null) {
      plain += text[i++];
      continue;
    }
    if (typeof node === "string") {
      plain += node;
    } else {
      if (plain) out.push(plain);
      plain = "";
      out.push(node);
    }
    i += length;
  }
  if (plain) out.push(plain);
  return out;
}

function link(label, href, source) {
  if (!LINK_SCHEMES.test(href)) return source;  // javascript:, data:, relative: left as text
  const a = el("a", null, label);
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}

// --------------------------------------------------------------------------------------
// The server's API
// --------------------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);
const STORED = { model: "pyengine.model", system: "pyengine.system", temperature: "pyengine.temperature",
  maxTokens: "pyengine.maxTokens" };
const KEY_STORED = "pyengine.apiKey";  // sessionStorage: gone when the tab closes

function storageGet(storage, name) {
  try { return storage.getItem(name) || ""; } catch { return ""; }  // storage may be disabled
}

function storageSet(storage, name, value) {
  try { if (value) storage.setItem(name, value); else storage.removeItem(name); } catch { /* not kept */ }
}

function authHeaders(extra) {
  const headers = Object.assign({}, extra);
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = "Bearer " + key;
  return headers;
}

// An Error with the server's message: Ollama's {"error": "..."} or OpenAI's {"error": {"message"}}.
async function responseError(response) {
  let message = "";
  try {
    message = await response.text();
    const error = JSON.parse(message).error;
    message = typeof error === "string" ? error : (error && error.message) || message;
  } catch { /* not JSON: the text as it came */ }
  const hint = response.status === 401 ? " (enter the server's API key in Settings)" : "";
  return new Error(`HTTP ${response.status}: ${message || response.statusText}${hint}`);
}

async function* ndjsonLines(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    for (let end; (end = buffer.indexOf("\n")) >= 0;) {
      const line = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 1);
      if (line) yield JSON.parse(line);
    }
  }
  buffer += decoder.decode();
  if (buffer.trim()) yield JSON.parse(buffer);
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("/api/tags", { headers: authHeaders() });
    if (!response.ok) throw await responseError(response);
    const names = ((await response.json()).models || []).map((model) => model.name).sort();
    const wanted = select.value || storageGet(localStorage, STORED.model);
    select.replaceChildren(...names.map((name) => el("option", null, name)));
    if (!names.length) {
      select.append(el("option", null, "no models"));
      select.firstChild.value = "";
      showError("The server has no models: start it with --model NAME, or run `pyengine pull NAME`.");
      return;
    }
    select.value = names.includes(wanted) ? wanted : names[0];
    hideError();
  } catch (error) {
    select.replaceChildren(el("option", null, "(unavailable)"));
    select.firstChild.value = "";
    showError("Could not list the models: " + error.message);
    if (/^HTTP 401/.test(error.message)) showSettings(true);
  }
}

// --------------------------------------------------------------------------------------
// The conversation
// --------------------------------------------------------------------------------------

const chat = { history: [], controller: null };

function chatOptions() {
  const options = {};
  const temperature = $("temperature").value.trim();
  const maxTokens = $("max-tokens").value.trim();
  if (temperature !== "" && Number.isFinite(Number(temperature))) options.temperature = Number(temperature);
  if (maxTokens !== "" && Number.isInteger(Number(maxTokens))) options.num_predict = Number(maxTokens);
  return options;
}

function systemTurns() {
  const system = $("system").value.trim();
  return system ? [{ role: "system", content: system }] : [];
}

function addUserMessage(text) {
  $("empty").hidden = true;
  const node = el("div", "msg user", [el("div", "role", "you"), el("div", "content", text)]);
  $("messages").append(node);
  scrollToEnd(true);
  return node;
}

// An assistant bubble: collapsed thinking, the Markdown reply, a line of figures.
function addAssistantMessage(model) {
  const thinkingText = el("div", "thinking-text");
  const summary = el("summary", null, "Thinking…");
  const thinking = el("details", "thinking", [summary, thinkingText]);
  thinking.hidden = true;
  const content = el("div", "content");
  const meta = el("div", "meta");
  const root = el("div", "msg assistant streaming", [el("div", "role", model), thinking, content, meta]);
  $("messages").append(root);
  scrollToEnd(true);
  let pending = null;
  const draw = () => {
    pending = null;
    const atEnd = nearEnd();
    thinking.hidden = !view.thinking;
    thinkingText.textContent = view.thinking;
    if (view.content) summary.textContent = "Thoughts";
    content.replaceChildren(renderMarkdown(view.content));
    scrollToEnd(atEnd);
  };
  const view = {
    root, content: "", thinking: "",
    update() { if (pending === null) pending = setTimeout(draw, 40); },  // at most 25 redraws a second
    finish(note, failed) {
      clearTimeout(pending);
      draw();
      root.classList.remove("streaming");
      root.classList.toggle("failed", Boolean(failed));
      meta.textContent = note || "";
    },
  };
  return view;
}

function nearEnd() {
  const box = $("messages");
  return box.scrollTop + box.clientHeight >= box.scrollHeight - 40;
}

function scrollToEnd(really) {
  if (really) $("messages").scrollTop = $("messages").scrollHeight;
}

function figures(last) {
  if (!last) return "";
  const parts = [];
  if (last.eval_count) {
    parts.push(`${last.eval_count} tokens`);
    if (last.eval_duration) parts.push(`${(last.eval_count / (last.eval_duration / 1e9)).toFixed(1)} tokens/s`);
  }
  if (last.done_reason === "length") parts.push("stopped at the token limit");
  return parts.join(" · ");
}

async function send(text) {
  const model = $("model").value;
  if (!model) {
    showError("Pick a model first.");
    return;
  }
  hideError();
  const turn = { role: "user", content: text };
  const history = chat.history;  // "New chat" replaces it: a reply finishing later lands in the old one
  const userNode = addUserMessage(text);
  const view = addAssistantMessage(model);
  const controller = new AbortController();
  chat.controller = controller;
  setBusy(true, "generating…");
  let last = null;
  try {
    const response = await fetch("/api/chat", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model, messages: [...systemTurns(), ...history, turn], stream: true,
        options: chatOptions() }),
      signal: controller.signal,
    });
    if (!response.ok) throw await responseError(response);
    for await (const chunk of ndjsonLines(response)) {
      if (chunk.error) throw new Error(chunk.error);
      const message = chunk.message || {};
      view.thinking += message.thinking || "";
      view.content += message.content || "";
      view.update();
      if (chunk.done) last = chunk;
    }
    if (!last) throw new Error("the reply ended before the server said it was done");
    history.push(turn, { role: "assistant", content: view.content });
    view.finish(figures(last));
    setStatus("");
  } catch (error) {
    if (error.name === "AbortError") {
      if (view.content) history.push(turn, { role: "assistant", content: view.content });
      view.finish("stopped");
      if (history === chat.history) setStatus("stopped");
    } else {
      // The turn is not kept: the message goes back into the box to be sent again.
      view.finish("failed", true);
      userNode.classList.add("failed");
      if (!$("prompt").value) $("prompt").value = text;
      showError(error.message);
      setStatus("");
    }
  } finally {
    if (chat.controller === controller) chat.controller = null;
    setBusy(false);
  }
}

function stop() {
  if (chat.controller) chat.controller.abort();  // the server sees the closed connection and frees the slot
}

function newChat() {
  stop();
  chat.history = [];
  $("messages").replaceChildren($("empty"));
  $("empty").hidden = false;
  hideError();
  setStatus("");
}

// --------------------------------------------------------------------------------------
// The page's controls
// --------------------------------------------------------------------------------------

function setBusy(busy, status) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  if (status !== undefined) setStatus(status);
}

function setStatus(text) {
  $("status").textContent = text;
}

function showError(text) {
  $("error-text").textContent = text;
  $("error").hidden = false;
}

function hideError() {
  $("error").hidden = true;
}

function showSettings(open) {
  $("settings").hidden = !open;
  $("settings-toggle").setAttribute("aria-expanded", String(open));
}

function bindSetting(id, storage, name, onChange) {
  const input = $(id);
  input.value = storageGet(storage, name);
  input.addEventListener("change", () => {
    storageSet(storage, name, input.value.trim());
    if (onChange) onChange();
  });
}

function start() {
  bindSetting("system", localStorage, STORED.system);
  bindSetting("temperature", localStorage, STORED.temperature);
  bindSetting("max-tokens", localStorage, STORED.maxTokens);
  bindSetting("api-key", sessionStorage, KEY_STORED, loadModels);
  $("model").addEventListener("change", () => storageSet(localStorage, STORED.model, $("model").value));
  $("settings-toggle").addEventListener("click", () => showSettings($("settings").hidden));
  $("new-chat").addEventListener("click", newChat);
  $("error-close").addEventListener("click", hideError);
  $("stop").addEventListener("click", stop);
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || chat.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  loadModels();
  $("prompt").focus();
}

start();
