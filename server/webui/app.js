// warmslot's page: a chat with the model and a live view of the slots and the cache.
// Plain JavaScript, no dependencies. It uses the server's public routes only, with the key
// the user gives, so the cache view shows exactly what /engine shows to that key (and, to
// the admin key, /engine/requests: every tenant's recent requests). A server of several
// models gets a picker: the chosen model answers, and the views follow it (?model=).
"use strict";

const $ = (id) => document.getElementById(id);
const SOURCES = ["slot", "fork", "ram", "disk", "computed"];
const POLL_MS = 1000;
const WINDOW_S = 300;  // the source chart's span
const BUCKET_S = 10;   // one bar

// -- storage ---------------------------------------------------------------------------

const store = {
  load(name, fallback) {
    try { return JSON.parse(localStorage.getItem("warmslot." + name)) ?? fallback; } catch { return fallback; }
  },
  save(name, value) { localStorage.setItem("warmslot." + name, JSON.stringify(value)); },
};

function apiKey() {
  return sessionStorage.getItem("warmslot.key") || localStorage.getItem("warmslot.key") || "";
}

function setKey(key, remember) {
  sessionStorage.setItem("warmslot.key", key);
  if (remember) localStorage.setItem("warmslot.key", key); else localStorage.removeItem("warmslot.key");
}

function headers(extra) {
  const out = Object.assign({}, extra || {});
  const key = apiKey();
  if (key) out.Authorization = "Bearer " + key;
  return out;
}

class Unauthorized extends Error {}
class Forbidden extends Error {}  // a valid key, not the admin's
class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function get(path, kind) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401) throw new Unauthorized(await errorText(r));
  if (r.status === 403) throw new Forbidden(await errorText(r));
  if (!r.ok) throw new HttpError(r.status, await errorText(r));
  return kind === "text" ? r.text() : r.json();
}

async function errorText(r) {
  const text = await r.text();
  try { return `${r.status}: ${JSON.parse(text).error.message}`; } catch { return `${r.status}: ${text.slice(0, 200)}`; }
}

// -- Markdown: HTML escaped first, then a small safe subset ----------------------------

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function inline(text) {  // text is already escaped
  const codes = [];
  text = text.replace(/`([^`\n]+)`/g, (_, code) => { codes.push(code); return `\u0000${codes.length - 1}\u0000`; });
  text = text.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>").replace(/(^|[^*])\*([^*\n]+)\*/g, "$1<em>$2</em>");
  return text.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${codes[+i]}</code>`);
}

function renderMarkdown(source) {
  const lines = escapeHtml(source).split("\n");
  const out = [];
  let para = [], list = null, code = null;
  const flushPara = () => { if (para.length) out.push(`<p>${inline(para.join("<br>"))}</p>`); para = []; };
  const flushList = () => { if (list) out.push(`<${list.tag}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`); list = null; };
  for (const line of lines) {
    if (code) {
      if (/^\s*```/.test(line)) { out.push(`<pre><code${code.lang}>${code.lines.join("\n")}</code></pre>`); code = null; }
      else code.lines.push(line);
      continue;
    }
    const fence = line.match(/^\s*```\s*([\w+-]*)/);
    const item = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/);
    const heading = line.match(/^(#{1,4})\s+(.*)$/);
    if (fence) { flushPara(); flushList(); code = { lang: fence[1] ? ` class="lang-${fence[1]}"` : "", lines: [] }; }
    else if (item) {
      flushPara();
      const tag = item[1] ? "ul" : "ol";
      if (list && list.tag !== tag) flushList();
      list = list || { tag, items: [] };
      list.items.push(item[3]);
    } else if (heading) { flushPara(); flushList(); out.push(`<h4>${inline(heading[2])}</h4>`); }
    else if (!line.trim()) { flushPara(); flushList(); }
    else { flushList(); para.push(line); }
  }
  if (code) out.push(`<pre><code${code.lang}>${code.lines.join("\n")}</code></pre>`);  // still streaming
  flushPara(); flushList();
  return out.join("");
}

// -- conversations -----------------------------------------------------------------------

let conversations = store.load("conversations", []);
for (const c of conversations) for (const m of c.messages) delete m.waiting;  // a page closed while a model loaded
let current = store.load("current", null);
const settings = Object.assign({ system: "", temperature: 0.7, max_tokens: 512 }, store.load("settings", {}));
let running = null;  // { controller, message }
const requestLog = [];

function conversation() {
  let c = conversations.find((c) => c.id === current);
  if (!c) {
    c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
    conversations.unshift(c);
    current = c.id;
  }
  return c;
}

function saveConversations() {
  const kept = conversations.slice(0, 50);
  try { store.save("conversations", kept); }
  catch { store.save("conversations", kept.map(withoutMedia)); }  // past the browser's quota: text only
  store.save("current", current);
}

function withoutMedia(c) {
  const strip = (m) => m.parts ? Object.assign({}, m, { parts: m.parts.map((p) => Object.assign({}, p, { url: null })) }) : m;
  return Object.assign({}, c, { messages: c.messages.map(strip) });
}

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren(...conversations.map((c) => {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.className = c.id === current ? "current" : "";
    li.addEventListener("click", () => { if (!running) { current = c.id; saveConversations(); renderAll(); } });
    return li;
  }));
}

function renderMessage(m) {
  const div = document.createElement("div");
  div.className = `msg ${m.role}`;
  if (m.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    details.innerHTML = `<summary>reasoning</summary>${renderMarkdown(m.reasoning)}`;
    div.append(details);
  }
  const body = document.createElement("div");
  body.className = "content";
  body.innerHTML = m.role === "user" ? `<p>${escapeHtml(m.content).replace(/\n/g, "<br>")}</p>` : renderMarkdown(m.content || "");
  div.append(body);
  if (m.waiting) {  // the request waits for its model to load
    const p = document.createElement("p");
    p.className = "muted waiting";
    p.textContent = m.waiting;
    div.append(p);
  }
  if (m.parts && m.parts.length) {
    const shelf = document.createElement("div");
    shelf.className = "attachments";
    shelf.append(...m.parts.map((p) => attachmentView(p)));
    div.append(shelf);
  }
  for (const call of m.tool_calls || []) {
    const pre = document.createElement("pre");
    pre.className = "tool-call";
    pre.textContent = `${call.function.name}(${call.function.arguments})`;
    div.append(pre);
  }
  if (m.error) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = m.error;
    div.append(p);
  }
  if (m.stats) {
    const s = m.stats, p = document.createElement("p");
    p.className = "stats";
    p.dataset.cached = s.cached;
    p.textContent = [
      `TTFT ${s.ttft_ms} ms`, `${s.tokens_per_s} tokens/s`, `cached_tokens ${s.cached}`,
      `prompt ${s.prompt}`, `${s.completion} tokens`, s.stopped ? "stopped" : s.finish, s.model,
    ].filter(Boolean).join(" · ");
    div.append(p);
  }
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...conversation().messages.map(renderMessage));
  box.scrollTop = box.scrollHeight;
}

function renderAll() { renderConversations(); renderMessages(); }

// -- attachments: images and audio for the next message -------------------------------

let modalities = { vision: false, audio: false };  // what the loaded model takes (/props)
let pending = [];  // the next message's { kind: "image" | "audio", name, url: a data: URL, format }
const AUDIO_FORMATS = {  // what the server decodes, by media type
  "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
  "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac",
};

function takes() {  // what the model takes besides text, in words ("" for text only)
  return [modalities.vision && "images", modalities.audio && "audio"].filter(Boolean).join(" and ");
}

function setModalities(m, unknown) {  // `unknown`: why what the model takes is not known yet
  modalities = { vision: Boolean(m && m.vision), audio: Boolean(m && m.audio) };
  const what = takes();
  $("attach").disabled = !what;
  $("attach").title = what ? `attach ${what} (or paste them, or drop them on the page)` : unknown || "this model takes text only";
  $("file-input").accept = [modalities.vision && "image/*", modalities.audio && Object.keys(AUDIO_FORMATS).join(",")]
    .filter(Boolean).join(",");
  $("input").placeholder = "Send a message (Enter; Shift+Enter for a new line)" +
    (what ? `; paste or drop ${what}` : "; this model takes text only");
}

function attachNote(text) {
  $("attach-note").textContent = text || "";
  $("attach-note").hidden = !text;
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function refusal(file) {  // why a file is not attached, in words
  const name = file.name || "the file";
  if (!takes() && !modelLoaded()) return `${name}: ${$("attach").title}.`;
  if (!takes()) return `${name}: this model takes text only (the server runs without a projector, --mmproj).`;
  if (file.type.startsWith("audio/") && modalities.audio) return `${name}: audio goes as WAV, MP3 or FLAC.`;
  return `${name}: this model takes ${takes()} only.`;
}

async function addFiles(files) {
  const refused = [];
  for (const file of files) {
    const format = AUDIO_FORMATS[file.type];
    const kind = file.type.startsWith("image/") && modalities.vision ? "image" : format && modalities.audio ? "audio" : null;
    if (kind) pending.push({ kind, name: file.name || kind, format, url: await readDataUrl(file) });
    else refused.push(refusal(file));
  }
  attachNote(refused.join(" "));
  renderPending();
}

function renderPending() {
  const box = $("attachments");
  box.replaceChildren(...pending.map((a) => attachmentView(a, () => { pending = pending.filter((p) => p !== a); renderPending(); })));
  box.hidden = !pending.length;
}

function attachmentView(a, remove) {  // a thumbnail, or a chip for a clip; `remove`: before sending
  const figure = document.createElement("figure");
  figure.className = `attachment ${a.kind}`;
  figure.title = a.name;
  if (a.kind === "image" && a.url) {
    const img = document.createElement("img");
    img.className = "thumb";
    img.src = a.url;
    img.alt = a.name;
    figure.append(img);
  } else {
    const chip = document.createElement("span");
    chip.className = "chip";
    chip.textContent = `${a.kind} ${a.name}` + (a.url ? "" : " (not kept: past this browser's storage)");
    figure.append(chip);
  }
  if (remove) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "remove";
    button.textContent = "×";
    button.setAttribute("aria-label", `remove ${a.name}`);
    button.addEventListener("click", remove);
    figure.append(button);
  }
  return figure;
}

function hasFiles(event) {
  return Boolean(event.dataTransfer) && Array.from(event.dataTransfer.types).includes("Files");
}

// -- chat --------------------------------------------------------------------------------

function apiContent(m, text) {  // a user message with media: OpenAI content parts
  const parts = (m.parts || []).filter((p) => p.url);
  if (!parts.length) return text;
  return [...(text ? [{ type: "text", text }] : []), ...parts.map((p) => p.kind === "image"
    ? { type: "image_url", image_url: { url: p.url } }
    : { type: "input_audio", input_audio: { data: p.url.slice(p.url.indexOf(",") + 1), format: p.format } })];
}

function apiMessages(c) {
  const out = settings.system ? [{ role: "system", content: settings.system }] : [];
  for (const m of c.messages) {
    if (m.role === "assistant" && m.error && !m.content) continue;
    let content = m.content || "";
    if (!content && m.tool_calls) content = m.tool_calls.map((t) => `${t.function.name}(${t.function.arguments})`).join("\n");
    out.push({ role: m.role, content: m.role === "user" ? apiContent(m, content) : content });
  }
  return out;
}

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

async function send(text, parts) {
  const c = conversation();
  if (c.messages.length === 0) c.title = text.slice(0, 40) || parts.map((p) => p.name).join(", ");
  c.messages.push({ role: "user", content: text, parts });
  const reply = { role: "assistant", content: "", reasoning: "", tool_calls: null, model: models ? chosen : null };
  if (models && !modelLoaded()) {
    reply.waiting = `loading ${chosen}…`;
    setModelState(chosen, "loading");
  }
  c.messages.push(reply);
  saveConversations();
  renderAll();
  const controller = new AbortController();
  running = { controller, reply };
  setRunning(true);
  const started = performance.now();
  let first = null, usage = null, finish = null, line = null;
  const view = () => $("messages").lastElementChild;
  try {
    const r = await postChat({
      model: models ? chosen : "default", messages: apiMessages(c).slice(0, -1), stream: true,
      stream_options: { include_usage: true },
      temperature: Number(settings.temperature), max_tokens: Number(settings.max_tokens),
    }, controller.signal);
    reply.waiting = null;
    view().replaceWith(renderMessage(reply));
    if (r.status === 401) askKey("the server refused the key: " + await errorText(r));
    if (!r.ok) throw new Error(await errorText(r));
    line = r.headers.get("x-warmslot-cache");
    for await (const event of sseEvents(r)) {
      if (event.error) throw new Error(event.error.message || JSON.stringify(event.error));
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        const d = choice.delta || {};
        if ((d.content || d.reasoning_content || d.tool_calls) && first === null) first = performance.now();
        if (d.content) reply.content += d.content;
        if (d.reasoning_content) reply.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) {
          reply.tool_calls = reply.tool_calls || [];
          const call = reply.tool_calls[t.index] = reply.tool_calls[t.index] || { function: { name: "", arguments: "" } };
          if (t.function && t.function.name) call.function.name += t.function.name;
          if (t.function && t.function.arguments) call.function.arguments += t.function.arguments;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      view().replaceWith(renderMessage(reply));
      $("messages").scrollTop = $("messages").scrollHeight;
    }
  } catch (err) {
    if (err.name !== "AbortError") reply.error = String(err.message || err);
  }
  reply.waiting = null;
  const stopped = controller.signal.aborted;
  const ended = performance.now();
  if (usage || stopped) {
    const u = usage || { prompt_tokens: 0, completion_tokens: 0, prompt_tokens_details: { cached_tokens: 0 } };
    const cached = (u.prompt_tokens_details || {}).cached_tokens || 0;
    const decodeS = first !== null ? (ended - first) / 1000 : 0;
    reply.stats = {
      ttft_ms: first !== null ? Math.round(first - started) : "-",
      tokens_per_s: decodeS > 0 && u.completion_tokens > 1 ? ((u.completion_tokens - 1) / decodeS).toFixed(1) : "-",
      cached, prompt: u.prompt_tokens, completion: u.completion_tokens, finish, stopped, model: reply.model,
    };
    logRequest(reply.stats, line);
  }
  running = null;
  setRunning(false);
  saveConversations();
  renderMessages();
}

// a request whose model is still loading past --models-load-timeout is answered 503 with
// Retry-After (the load goes on): it is sent again then, until it is answered or stopped
const WAIT_CODES = ["loading", "models_busy"];

async function postChat(body, signal) {
  for (;;) {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers({ "Content-Type": "application/json" }), signal, body: JSON.stringify(body),
    });
    if (r.status !== 503 || !models) return r;
    const code = await r.clone().json().then((b) => b.error && b.error.code, () => null);
    if (!WAIT_CODES.includes(code)) return r;
    await new Promise((resolve) => setTimeout(resolve, 1000 * Number(r.headers.get("retry-after") || 1)));
    if (signal.aborted) throw new DOMException("stopped", "AbortError");
  }
}

function setRunning(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("model-picker").disabled = on;
}

// -- models: a server of several has a picker ---------------------------------------------

let models = null;  // several models: [{ id, state }] as /v1/models lists them (null: one model)
let chosen = store.load("model", null);  // the picked model's name
let shown = null;  // "name state" of the model whose /props the page shows

async function listModels() {  // /v1/models gives each model's state only when there are several
  const data = (await get("/v1/models")).data || [];
  return data.some((m) => m.state) ? data.map((m) => ({ id: m.id, state: m.state })) : null;
}

function modelState() { const m = models && models.find((m) => m.id === chosen); return m ? m.state : "loaded"; }
function modelLoaded() { return modelState() === "loaded"; }
function modelQuery() { return models ? `?model=${encodeURIComponent(chosen)}` : ""; }

function setModelState(name, state) {
  const m = models && models.find((m) => m.id === name);
  if (m) m.state = state;
  renderPicker();
}

function pickModel() {  // the kept choice while the server lists it, else a loaded model, else the first
  if (!models || models.some((m) => m.id === chosen)) return;
  chosen = (models.find((m) => m.state === "loaded") || models[0]).id;
}

function renderPicker() {
  const picker = $("model-picker");
  picker.hidden = !models;
  $("model").hidden = Boolean(models);
  if (!models) return;
  const same = picker.options.length === models.length && models.every((m, i) => picker.options[i].value === m.id);
  if (!same) picker.replaceChildren(...models.map(() => document.createElement("option")));
  models.forEach((m, i) => {  // in place: an open list stays open while the states refresh
    const option = picker.options[i];
    option.value = m.id;
    option.textContent = `${m.id} · ${m.state}`;
    option.dataset.state = m.state;
  });
  picker.value = chosen;
  picker.title = `${chosen} is ${modelState()}` + (modelLoaded() ? "" : ": sending a message loads it");
}

async function propsOfModel() {  // /props of the chosen model; null while it is not loaded (503)
  try {
    return await get("/props" + modelQuery());
  } catch (err) {
    if (models && err instanceof HttpError && err.status === 503) return null;
    throw err;  // 401 (the key), or a single model still loading
  }
}

async function followModel() {  // what the chosen model takes and holds, asked again when its state changes
  const key = `${chosen} ${modelState()}`;
  if (key === shown) return;
  const props = await propsOfModel();
  if (key !== `${chosen} ${modelState()}`) return;  // the choice or the state moved on meanwhile: asked again
  shown = key;
  $("model").textContent = props ? props.model_alias || "" : chosen;
  if (props) setModalities(props.modalities);
  else setModalities(null, `${chosen} is ${modelState()}: what it takes is known once it is loaded (send a message)`);
  capacity = props ? props.capacity || null : null;
  renderCapacity();
}

function chooseModel() {
  chosen = $("model-picker").value;
  store.save("model", chosen);
  samples.length = 0;  // the source chart counts the chosen model's tokens
  renderPicker();
  poll();
}

function renderModels(view) {  // GET /models/capacity: each model's memory, and whether they fit together
  $("models-panel").hidden = !view;
  if (!view) return;
  $("models").tBodies[0].replaceChildren(...view.data.map((m) => {
    const memory = `${bytes(m.total_bytes)} <span class="muted">${escapeHtml(m.source)}</span>` +
      (m.not_counted.length ? `<div class="muted">not counted: ${escapeHtml(m.not_counted.join(", "))}</div>` : "");
    const tr = row(escapeHtml(m.model), escapeHtml(m.state), memory, m.cache_ram_bytes ? bytes(m.cache_ram_bytes) : "off");
    tr.dataset.model = m.model;
    tr.dataset.state = m.state;
    return tr;
  }));
  $("models-fit").textContent = view.together.summary;
  $("models-fit").dataset.fits = view.together.fits;
}

// -- the cache view ----------------------------------------------------------------------

const samples = [];  // { t, totals: { source: tokens } } from /metrics
let capacity = null;

function metricValues(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^(warmslot_[a-z_]+)(\{[^}]*\})?\s+(\S+)$/);
    if (m) out[m[1] + (m[2] || "")] = Number(m[3]);
  }
  return out;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function bar(used, total) {
  const pct = total > 0 ? Math.min(100, (100 * used) / total) : 0;
  return `<div class="bar"><div style="width:${pct.toFixed(1)}%"></div></div>`;
}

function cell(text) { const td = document.createElement("td"); td.innerHTML = text; return td; }
function row(...cells) { const tr = document.createElement("tr"); tr.append(...cells.map(cell)); return tr; }

function renderUnloaded() {  // the chosen model is not loaded: no slots to show
  $("queue").textContent = modelState();
  $("slots").tBodies[0].replaceChildren(row("-", escapeHtml(modelState()), "", `${escapeHtml(chosen)}: a request naming it loads it`));
}

function renderSlots(view) {
  const perSlot = capacity ? capacity.n_ctx_slot : view.n_ctx;
  $("queue").textContent = `${view.memory} · queue ${view.queue_depth}`;
  $("slots").tBodies[0].replaceChildren(...view.slots.map((s) => {
    const r = s.request;
    let progress = s.redacted ? "another key's" : (s.idle_s ? `idle ${s.idle_s.toFixed(0)} s` : "");
    if (r) {
      progress = s.state === "prefill" ? `prefill ${r.n_cached}/${r.n_prompt}` : `prompt ${r.n_prompt} (${r.n_cached} cached) + ${r.n_generated}`;
    }
    const tr = row(String(s.id), `<span class="state ${s.state}">${s.state}</span>`,
      `${s.n_tokens}${bar(s.n_tokens, perSlot)}`,
      escapeHtml(progress) + (s.tenant ? ` <span class="muted">tenant ${escapeHtml(s.tenant)}</span>` : "") + runs(s.images));
    tr.dataset.state = s.state;
    tr.dataset.tokens = s.n_tokens;
    return tr;
  }));
}

function runs(images) {  // image and audio runs by the hash of their bytes, as /slots names them
  return (images || []).map((r) => `<div class="run" data-hash="${escapeHtml(r.hash)}">${escapeHtml(r.kind)} ` +
    `<code>${escapeHtml(r.hash)}</code> [${r.start}, ${r.start + r.n_tokens})</div>`).join("");
}

function renderTiers(view, m) {
  const rows = [];
  // the device tier: sequences (slots and spare streams) holding a conversation that runs nothing
  const idle = view ? view.slots.filter((s) => s.state === "idle" && s.n_tokens > 0) : [];
  if (view && capacity && capacity.kv_bytes_per_token) {
    const per = capacity.kv_bytes_per_token, held = idle.reduce((a, s) => a + s.n_tokens, 0);
    rows.push(["device (idle conversations)", held * per, capacity.n_seq * capacity.n_ctx_slot * per,
      `${idle.length} of ${capacity.n_seq} sequences (${capacity.n_seq - capacity.n_slots} spare), ` +
      `${view.device_tokens} distinct tokens held in all`]);
  }
  if (view && view.cache) rows.push(["RAM prompt cache", view.cache.bytes, view.cache.budget_bytes,
    `${view.cache.n_entries} entries, ${view.cache.tokens} distinct tokens`]);
  if (m && !models) {  // the disk tier and the checkpoints are in /metrics only (the default model's, with several)
    const diskBudget = m["warmslot_disk_cache_budget_bytes"];
    if (diskBudget) rows.push(["disk", m["warmslot_disk_cache_bytes"] || 0, diskBudget, `${m["warmslot_disk_cache_entries"] || 0} entries`]);
    else if (m["warmslot_disk_cache_budget_bytes"] !== undefined || view.cache) rows.push(["disk", 0, 0, "off (--cache-disk)"]);
    const ckpt = m["warmslot_checkpoint_bytes"];
    if (ckpt !== undefined && capacity) rows.push(["checkpoints", ckpt, capacity.checkpoint_budget_bytes, ""]);
  }
  $("tiers").innerHTML = rows.map(([name, used, budget, note]) =>
    `<div class="tier" data-tier="${name}"><span>${name}</span><span>${bytes(used)} / ${budget ? bytes(budget) : "-"} ${escapeHtml(note)}</span>${bar(used, budget)}</div>`).join("");
}

function renderSources() {
  const now = Date.now() / 1000;
  while (samples.length > 1 && samples[1].t < now - WINDOW_S) samples.shift();
  const n = WINDOW_S / BUCKET_S;
  const buckets = Array.from({ length: n }, () => Object.fromEntries(SOURCES.map((s) => [s, 0])));
  const totals = Object.fromEntries(SOURCES.map((s) => [s, 0]));
  for (let i = 1; i < samples.length; i++) {
    const k = Math.floor((now - samples[i].t) / BUCKET_S);
    if (k >= n) continue;
    for (const s of SOURCES) {
      const d = Math.max(0, samples[i].totals[s] - samples[i - 1].totals[s]);
      buckets[n - 1 - k][s] += d;
      totals[s] += d;
    }
  }
  const peak = Math.max(1, ...buckets.map((b) => SOURCES.reduce((a, s) => a + b[s], 0)));
  $("source-chart").innerHTML = buckets.map((b) =>
    `<div class="col">${SOURCES.map((s) => b[s] ? `<div class="src-${s}" style="height:${(100 * b[s] / peak).toFixed(1)}%"></div>` : "").join("")}</div>`).join("");
  $("source-legend").innerHTML = SOURCES.map((s) =>
    `<li><span class="swatch src-${s}"></span>${s} <b data-source="${s}">${totals[s]}</b></li>`).join("");
}

function renderCapacity() {
  if (!capacity) { $("capacity").tBodies[0].replaceChildren(); return; }
  const c = capacity, sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);
  const by = (o) => Object.entries(o || {}).map(([d, b]) => `${escapeHtml(d)} ${bytes(b)}`).join(", ") || "-";
  const rows = [
    ["context", `${c.context ? c.context.n_ctx : "-"} tokens (${c.context ? escapeHtml(c.context.source) : "-"}), ${c.n_ctx_slot} per slot, ${c.n_slots} slots`],
    ["weights", by(c.weights_bytes)],
    ["KV cache", `${by(c.kv_bytes)}${c.kv_bytes_per_token ? `, ${bytes(c.kv_bytes_per_token)} per token` : ""}`],
    ["recurrent state", c.recurrent_bytes_per_slot ? `${bytes(c.recurrent_bytes_per_slot)} per slot` : "-"],
    ["compute buffers", by(c.compute_bytes)],
    ["checkpoints", `up to ${c.checkpoints_per_slot} and ${bytes(c.checkpoint_bytes_per_slot)} per slot, ${bytes(c.checkpoint_budget_bytes)} in all`],
    ["prompt cache (RAM)", `${bytes(c.cache_ram_bytes)} (${escapeHtml(String(c.cache_ram))})`],
    ["pinned host memory", c.pinned_limit_bytes ? bytes(c.pinned_limit_bytes) : "none"],
    ["in all", bytes(sum(c.weights_bytes) + sum(c.kv_bytes) + sum(c.compute_bytes))],
  ];
  $("capacity").tBodies[0].replaceChildren(...rows.map(([k, v]) => row(k, v)));
}

function logRequest(stats, line) {
  const fields = Object.fromEntries((line || "").split(";").map((p) => p.trim().split("=")).filter((p) => p.length === 2));
  let where = fields.source ? `${fields.source}${fields.slot ? ` (slot ${fields.slot})` : ""}` : "-";
  if (fields.checkpoint) where += `, checkpoint ${fields.checkpoint}`;
  if (fields.diverged) where += `, diverged at token ${fields.diverged}${fields.message ? ` in message ${fields.message}` : ""}`;
  requestLog.unshift({ ttft: stats.ttft_ms, cached: stats.cached, computed: stats.prompt - stats.cached, where });
  requestLog.length = Math.min(requestLog.length, 10);
  $("requests").tBodies[0].replaceChildren(...requestLog.map((r) =>
    row(`${r.ttft} ms`, String(r.cached), String(r.computed), escapeHtml(r.where))));
}

// the admin's view: every tenant's recent requests, with why their prompts missed
let admin = null;  // the key may read /engine/requests (null: not asked yet)

function whereFrom(e) {  // a redacted explanation in words, as the X-Warmslot-Cache line is shown
  if (!e || !e.source) return "-";
  let where = `${e.source}${e.slot >= 0 ? ` (slot ${e.slot})` : ""}`;
  if (e.restored_checkpoint !== null && e.restored_checkpoint !== undefined) where += `, checkpoint ${e.restored_checkpoint}`;
  const d = e.divergence;
  if (d) where += `, diverged at token ${d.token}${d.message !== undefined ? ` in message ${d.message} (${d.role})` : ""}`;
  if (e.reason) where += `; ${e.reason}`;
  return where;
}

function renderRecent(items) {
  $("recent-requests").tBodies[0].replaceChildren(...items.map((r) => {
    const where = `<span class="muted">${escapeHtml(r.route)}</span> ${escapeHtml(whereFrom(r.explanation))}${runs(r.images)}`;
    const tr = row(new Date(r.ended * 1000).toLocaleTimeString(), escapeHtml(r.tenant || "-"), `${r.cached_tokens} / ${r.prompt_tokens}`, where);
    tr.dataset.id = r.id;
    return tr;
  }));
}

async function pollRecent() {
  if (admin === false) return;
  try {
    renderRecent((await get("/engine/requests?limit=20")).data);
    admin = true;
  } catch (err) {
    if (!(err instanceof Forbidden)) throw err;
    admin = false;  // another key: the slots view shows its own requests
  }
  $("recent").hidden = !admin;
}

async function metricsOrNull() {  // with API keys, /metrics is the admin's (unless --metrics-open)
  try {
    return metricValues(await get("/metrics", "text"));
  } catch (err) {
    if (err instanceof Forbidden) return null;
    throw err;
  }
}

function sourceMetric(source) {  // with several models, the chosen model's family
  return models ? `warmslot_model_prompt_tokens_total{model="${chosen}",source="${source}"}` : `warmslot_prompt_tokens_total{source="${source}"}`;
}

let polling = false;  // one poll at a time: a slow answer never lands after a newer one

async function poll() {
  if (polling) return;
  polling = true;
  try {
    if (models) {
      models = (await listModels()) || models;
      renderPicker();
      await followModel();
    }
    const [view, m, fit] = await Promise.all([
      modelLoaded() ? get("/engine" + modelQuery()) : null, metricsOrNull(), models ? get("/models/capacity") : null,
    ]);
    renderModels(fit);
    if (view) {
      capacity = view.capacity || capacity;
      renderSlots(view);
    } else renderUnloaded();
    renderTiers(view, m);
    if (m) {
      samples.push({ t: Date.now() / 1000, totals: Object.fromEntries(SOURCES.map((s) => [s, m[sourceMetric(s)] || 0])) });
      renderSources();
    } else $("source-legend").innerHTML = `<li class="muted">/metrics needs the admin key</li>`;
    renderCapacity();
    await pollRecent();
    $("cache-error").hidden = true;
  } catch (err) {
    if (err instanceof Unauthorized) askKey();
    $("cache-error").textContent = String(err.message || err);
    $("cache-error").hidden = false;
  } finally {
    polling = false;
  }
}

// -- the key -----------------------------------------------------------------------------

function askKey(message) {
  const dialog = $("key-dialog");
  $("key-button").hidden = false;
  $("key-error").textContent = message || "";
  $("key-error").hidden = !message;
  if (!dialog.open) dialog.showModal();
}

async function tryKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  setKey(key, $("key-remember").checked);
  try {
    await start();
    $("key-dialog").close();
  } catch (err) {
    askKey(err instanceof Unauthorized ? `the key was refused (${err.message})` : String(err.message || err));
  }
}

// -- start -------------------------------------------------------------------------------

let pollTimer = null;

async function start() {
  models = await listModels();
  pickModel();
  renderPicker();
  shown = null;
  await followModel();  // /props: 401 without the right key
  admin = null;
  if (!pollTimer) pollTimer = setInterval(() => { if (!document.hidden) poll(); }, POLL_MS);
  poll();
}

function bind() {
  $("system-prompt").value = settings.system;
  $("temperature").value = settings.temperature;
  $("max-tokens").value = settings.max_tokens;
  for (const [id, name] of [["system-prompt", "system"], ["temperature", "temperature"], ["max-tokens", "max_tokens"]]) {
    $(id).addEventListener("change", () => { settings[name] = $(id).value; store.save("settings", settings); });
  }
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if ((!text && !pending.length) || running) return;
    const parts = pending;
    $("input").value = "";
    pending = [];
    renderPending();
    attachNote("");
    send(text, parts);
  });
  bindAttachments();
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => { if (running) running.controller.abort(); });
  $("model-picker").addEventListener("change", chooseModel);
  $("new-chat").addEventListener("click", () => { if (!running) { current = null; conversation(); saveConversations(); renderAll(); } });
  $("key-form").addEventListener("submit", tryKey);
  $("key-button").addEventListener("click", () => askKey());
}

function bindAttachments() {
  $("attach").addEventListener("click", () => $("file-input").click());
  $("file-input").addEventListener("change", (e) => { const files = Array.from(e.target.files); e.target.value = ""; addFiles(files); });
  document.addEventListener("paste", (e) => {
    const files = e.clipboardData ? Array.from(e.clipboardData.files) : [];
    if (files.length) { e.preventDefault(); addFiles(files); }
  });
  document.addEventListener("dragover", (e) => { if (hasFiles(e)) { e.preventDefault(); $("chat").classList.add("dropping"); } });
  document.addEventListener("dragleave", () => $("chat").classList.remove("dropping"));
  document.addEventListener("drop", (e) => {
    $("chat").classList.remove("dropping");
    if (hasFiles(e)) { e.preventDefault(); addFiles(Array.from(e.dataTransfer.files)); }
  });
}

bind();
renderAll();
function begin() {
  start().catch((err) => {
    if (err instanceof Unauthorized) return askKey();
    $("cache-error").textContent = String(err.message || err);  // e.g. 503 while the model loads
    $("cache-error").hidden = false;
    setTimeout(begin, 2000);
  });
}
begin();
