// The chat page: conversations in localStorage, replies streamed from /v1/chat/completions
// (the OpenAI route every client uses), rendered as Markdown built from DOM nodes only.
import { api, boot, el, errorMessage } from "./common.js";
import { renderMarkdown } from "./markdown.js";

const STORE = "pagedattn.conversations";
const SETTINGS = "pagedattn.settings";
const MAX_CONVERSATIONS = 100;
const DEFAULTS = { model: "", system: "", temperature: 0.7, top_p: 1, max_tokens: 512, extra: "" };

const $ = (id) => document.getElementById(id);
let conversations = load(STORE, []);
let settings = { ...DEFAULTS, ...load(SETTINGS, {}) };
let current = conversations[0]?.id ?? null;
let streaming = null; // { conv, reply, controller } while a reply streams

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function save() {
  conversations.sort((a, b) => b.updated - a.updated);
  conversations = conversations.slice(0, MAX_CONVERSATIONS);
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  } catch (err) {
    console.warn("could not save the conversations:", err);
  }
}

const conversation = () => conversations.find((c) => c.id === current) ?? null;

function newConversation() {
  const conv = { id: crypto.randomUUID(), title: "New chat", updated: Date.now(), messages: [] };
  conversations.unshift(conv);
  current = conv.id;
  return conv;
}

// ---- rendering --------------------------------------------------------------------------

function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conv of conversations) {
    const item = el("li", conv.id === current ? "active" : "");
    const open = el("button", "title", conv.title);
    open.type = "button";
    open.addEventListener("click", () => { current = conv.id; renderAll(); });
    const remove = el("button", "remove", "×");
    remove.type = "button";
    remove.title = "Delete this conversation";
    remove.addEventListener("click", () => {
      if (streaming?.conv === conv) streaming.controller.abort();
      conversations = conversations.filter((c) => c !== conv);
      if (current === conv.id) current = conversations[0]?.id ?? null;
      save();
      renderAll();
    });
    item.append(open, remove);
    list.appendChild(item);
  }
}

function statsLine(stats) {
  const line = el("div", "stats");
  const add = (cls, text, title) => {
    const span = line.appendChild(el("span", cls, text));
    if (title) span.title = title;
  };
  add("stat-tokens", `${stats.completion_tokens} tokens`, "completion tokens (usage)");
  if (stats.tok_s != null) add("stat-speed", `${stats.tok_s.toFixed(1)} tok/s`, "tokens after the first / time after the first");
  if (stats.ttft_ms != null) add("stat-ttft", `TTFT ${Math.round(stats.ttft_ms)} ms`, "time to first token, as this page saw it");
  add("stat-cached", `${stats.cached_tokens}/${stats.prompt_tokens} prompt tokens cached`, "usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache");
  return line;
}

function messageNode(conv, msg, index) {
  const node = el("div", `msg ${msg.role}`);
  node.dataset.index = String(index);
  node.appendChild(el("div", "avatar", msg.role === "user" ? "You" : "AI"));
  const bubble = node.appendChild(el("div", "bubble"));
  const body = bubble.appendChild(el("div", msg.role === "user" ? "body plain" : "body markdown"));
  if (msg.role === "user") body.textContent = msg.content;
  else renderMarkdown(msg.content, body);
  if (msg.pending) bubble.appendChild(el("div", "typing", "generating…"));
  if (msg.error) bubble.appendChild(el("div", "error", msg.error));
  if (msg.stopped) bubble.appendChild(el("div", "note", "stopped"));
  if (msg.stats) bubble.appendChild(statsLine(msg.stats));
  const actions = bubble.appendChild(el("div", "actions"));
  const action = (label, handler) => {
    const b = actions.appendChild(el("button", "link", label));
    b.type = "button";
    b.addEventListener("click", handler);
  };
  if (!streaming && msg.role === "user") action("Edit", () => editMessage(conv, index, node));
  if (msg.role === "assistant" && !msg.pending) {
    action("Copy", () => navigator.clipboard?.writeText(msg.content));
    if (!streaming && index === conv.messages.length - 1) {
      action("Regenerate", () => { conv.messages.pop(); generate(conv); });
    }
  }
  return node;
}

function renderMessages() {
  const box = $("messages");
  const conv = conversation();
  box.replaceChildren();
  if (!conv || conv.messages.length === 0) {
    const empty = el("div", "empty");
    empty.append(el("h2", "", "Chat with the served model"),
      el("p", "", "Replies stream from /v1/chat/completions. Conversations stay in this browser."));
    box.appendChild(empty);
    return;
  }
  conv.messages.forEach((msg, i) => box.appendChild(messageNode(conv, msg, i)));
  box.scrollTop = box.scrollHeight;
}

function renderControls() {
  $("send").hidden = streaming !== null;
  $("stop").hidden = streaming === null;
}

function renderAll() {
  renderList();
  renderMessages();
  renderControls();
}

let frame = 0;
function renderSoon(conv) {
  if (conv.id !== current || frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    const box = $("messages");
    const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
    const last = box.lastElementChild;
    const index = conv.messages.length - 1;
    if (last?.dataset.index === String(index)) last.replaceWith(messageNode(conv, conv.messages[index], index));
    else renderMessages();
    if (stick) box.scrollTop = box.scrollHeight;
  });
}

function editMessage(conv, index, node) {
  const bubble = node.querySelector(".bubble");
  const editor = el("textarea", "editor");
  editor.value = conv.messages[index].content;
  const save = el("button", "primary", "Save & send");
  const cancel = el("button", "ghost", "Cancel");
  save.type = cancel.type = "button";
  const row = el("div", "edit-actions");
  row.append(save, cancel);
  bubble.replaceChildren(editor, row);
  editor.focus();
  cancel.addEventListener("click", renderMessages);
  save.addEventListener("click", () => {
    const text = editor.value.trim();
    if (!text) return;
    conv.messages = conv.messages.slice(0, index);
    conv.messages.push({ role: "user", content: text });
    generate(conv);
  });
}

// ---- requests ---------------------------------------------------------------------------

function extraFields() {
  const text = settings.extra.trim();
  if (!text) return {};
  const value = JSON.parse(text);
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("Extra request fields: expected a JSON object");
  }
  return value;
}

function requestBody(conv) {
  const messages = [];
  if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
  for (const m of conv.messages) {
    if (!m.pending) messages.push({ role: m.role, content: m.content });
  }
  return {
    model: settings.model,
    messages,
    temperature: Number(settings.temperature),
    top_p: Number(settings.top_p),
    max_tokens: Number(settings.max_tokens),
    ...extraFields(),
    stream: true,
    stream_options: { include_usage: true },
  };
}

async function generate(conv) {
  if (streaming) return;
  const reply = { role: "assistant", content: "", pending: true };
  let body;
  try {
    body = requestBody(conv);
  } catch (err) {
    $("extra-error").textContent = err.message;
    return;
  }
  conv.messages.push(reply);
  conv.updated = Date.now();
  const controller = new AbortController();
  streaming = { conv, reply, controller };
  renderAll();
  const started = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorMessage(res));
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r/g, "");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (!data || data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server failed this reply");
        if (chunk.usage) usage = chunk.usage;
        const text = chunk.choices?.[0]?.delta?.content;
        if (text) {
          const now = performance.now();
          first ??= now;
          last = now;
          reply.content += text;
          renderSoon(conv);
        }
      }
    }
  } catch (err) {
    if (err.name === "AbortError") reply.stopped = true;
    else reply.error = err.message || String(err);
  } finally {
    reply.pending = false;
    delete reply.pending;
    if (usage) {
      const n = usage.completion_tokens;
      reply.stats = {
        completion_tokens: n,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
        ttft_ms: first === null ? null : first - started,
        tok_s: n > 1 && last > first ? ((n - 1) * 1000) / (last - first) : null,
      };
    }
    if (conv.title === "New chat") {
      const firstUser = conv.messages.find((m) => m.role === "user");
      if (firstUser) conv.title = firstUser.content.slice(0, 48);
    }
    streaming = null;
    save();
    if (frame) {  // the last chunk's redraw: renderAll below draws the finished reply
      cancelAnimationFrame(frame);
      frame = 0;
    }
    if (conv.id === current) renderAll();
    else renderList();
  }
}

function send() {
  const input = $("prompt");
  const text = input.value.trim();
  if (!text || streaming) return;
  if (!settings.model) return;
  const conv = conversation() ?? newConversation();
  conv.messages.push({ role: "user", content: text });
  input.value = "";
  autosize(input);
  generate(conv);
}

// ---- settings and controls --------------------------------------------------------------

function autosize(textarea) {
  textarea.style.height = "auto";
  textarea.style.height = `${Math.min(textarea.scrollHeight, 240)}px`;
}

function bindSettings() {
  for (const key of ["system", "temperature", "top_p", "max_tokens", "extra"]) {
    const input = $(key);
    input.value = settings[key];
    const out = document.getElementById(`${key}-value`);
    if (out) out.textContent = String(settings[key]);
    input.addEventListener("input", () => {
      settings[key] = input.value;
      if (out) out.textContent = input.value;
      if (key === "extra") {
        try { extraFields(); $("extra-error").textContent = ""; } catch (err) { $("extra-error").textContent = err.message; }
      }
      save();
    });
  }
  $("reset-settings").addEventListener("click", () => {
    settings = { ...DEFAULTS, model: settings.model };
    save();
    bindSettingsValues();
  });
}

function bindSettingsValues() {
  for (const key of ["system", "temperature", "top_p", "max_tokens", "extra"]) {
    $(key).value = settings[key];
    const out = document.getElementById(`${key}-value`);
    if (out) out.textContent = String(settings[key]);
  }
  $("extra-error").textContent = "";
}

async function loadModels() {
  const res = await api("/v1/models");
  if (!res.ok) throw new Error(await errorMessage(res));
  const models = (await res.json()).data;
  const select = $("model");
  select.replaceChildren(...models.map((m) => el("option", "", m.id)));
  if (!models.some((m) => m.id === settings.model)) settings.model = models[0]?.id ?? "";
  select.value = settings.model;
  const describe = () => {
    const card = models.find((m) => m.id === settings.model);
    $("context").textContent = card?.max_model_len ? `context ${card.max_model_len} tokens` : "";
  };
  describe();
  select.onchange = () => { settings.model = select.value; save(); describe(); };
}

let started = false;
async function start() {
  await loadModels();
  if (started) return;
  started = true;
  bindSettings();
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("prompt").addEventListener("input", (e) => autosize(e.target));
  $("stop").addEventListener("click", () => streaming?.controller.abort());
  // leaving the page (closed, reloaded, navigated away or frozen in the back/forward cache)
  // stops the reply: the server aborts the request as soon as the stream is closed
  window.addEventListener("pagehide", () => {
    if (!streaming) return;
    streaming.reply.stopped = true;
    delete streaming.reply.pending;
    streaming.controller.abort();
    save();
  });
  $("new-chat").addEventListener("click", () => {
    if (conversation()?.messages.length === 0) return;
    newConversation();
    renderAll();
    $("prompt").focus();
  });
  $("toggle-settings").addEventListener("click", () => $("settings").classList.toggle("open"));
  window.addEventListener("storage", (e) => {
    if (e.key === STORE && !streaming) { conversations = load(STORE, []); renderAll(); }
  });
  renderAll();
  $("prompt").focus();
}

boot(start);
