// The relay page: a chat, one run per message, each rebuilt from the run's SSE events (so a
// reload replays the thread's stored runs from the start, one after the other, and shows the
// same view; EventSource resumes a dropped connection by itself with Last-Event-ID).
// Everything shown goes through textContent or the DOM-building markdown renderer below.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "toollatch.chat"; // {chat_id, runs: [{id, events_url, cancel_url, message}]}
const LEGACY = "toollatch.run"; // one run, as pages before the thread kept it
const MAX_THREAD = 50; // runs kept in the thread (the relay forgets old runs anyway)
let view = null;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- markdown, safely ------------------------------------------------------------------------
// The model's text as a small markdown subset, built as DOM nodes: every character the model
// wrote ends up in a Text node (textContent), never parsed as HTML (no innerHTML anywhere),
// so `<img onerror=...>` or `<script>` is shown as the text it is. Rendered: paragraphs
// (a single newline is a line break), fenced code blocks (```), headings (#..######), flat
// bullet and numbered lists, inline code, **bold** / __bold__, *italic* / _italic_, and
// [links](url) only for http(s) URLs (opened with rel="noopener noreferrer"); any other link
// (javascript:, data:, relative) stays plain text. Text past MD_MAX_CHARS is shown plain
// (the inline patterns are bounded, but a page need not parse megabytes on every token).
const MD_MAX_CHARS = 100_000;
const INLINE = new RegExp([
  "`([^`\\n]{1,2000})`",                                          // 1 code
  "\\[([^\\]\\n]{1,500})\\]\\(([^()\\s]{1,2000})\\)",             // 2 text, 3 url
  "\\*\\*([^*\\n](?:[^\\n]{0,1000}?[^*\\s])?)\\*\\*",             // 4 bold
  "(?<![\\w])__([^_\\n](?:[^\\n]{0,1000}?[^_\\s])?)__(?![\\w])",  // 5 bold
  "\\*([^*\\s](?:[^*\\n]{0,1000}?[^*\\s])?)\\*",                  // 6 italic
  "(?<![\\w])_([^_\\s](?:[^_\\n]{0,1000}?[^_\\s])?)_(?![\\w])",   // 7 italic
].join("|"), "g");

function safeUrl(raw) {
  let url;
  try { url = new URL(raw); } catch { return null; }
  return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
}

function inline(parent, text, depth = 0) {
  if (depth > 4) { parent.append(text); return; }
  const pattern = new RegExp(INLINE.source, "g");
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] !== undefined) {
      parent.append(el("code", null, m[1]));
    } else if (m[2] !== undefined) {
      const href = safeUrl(m[3]);
      if (href === null) { parent.append(m[0]); continue; }
      const a = el("a");
      a.href = href;
      a.rel = "noopener noreferrer";
      a.target = "_blank";
      inline(a, m[2], depth + 1);
      parent.append(a);
    } else {
      const strong = m[4] !== undefined || m[5] !== undefined;
      const node = el(strong ? "strong" : "em");
      inline(node, m[4] ?? m[5] ?? m[6] ?? m[7], depth + 1);
      parent.append(node);
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

function lines(parent, rows) {
  rows.forEach((row, i) => { if (i) parent.append(el("br")); inline(parent, row); });
}

function renderMarkdown(target, source) {
  const out = document.createDocumentFragment();
  if (source.length > MD_MAX_CHARS) {
    out.append(el("p", "plain", source));
    target.replaceChildren(out);
    return;
  }
  const rows = source.split("\n");
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) { const p = el("p"); lines(p, para); out.append(p); para = []; }
  };
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i];
    const fence = /^\s*(```+|~~~+)\s*([\w+-]*)\s*$/.exec(row);
    if (fence) {
      flush(); list = null;
      const code = [];
      for (i++; i < rows.length && !rows[i].trim().startsWith(fence[1]); i++) code.push(rows[i]);
      const pre = el("pre");
      const c = el("code", null, code.join("\n"));
      if (fence[2]) c.dataset.lang = fence[2];
      pre.append(c);
      out.append(pre);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(row);
    if (heading) {
      flush(); list = null;
      const h = el("h" + Math.min(6, heading[1].length + 2)); // h3..h6: inside a message
      inline(h, heading[2]);
      out.append(h);
      continue;
    }
    const item = /^\s{0,3}(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(row);
    if (item) {
      flush();
      const tag = item[1] ? "ul" : "ol";
      if (list === null || list.tagName.toLowerCase() !== tag) {
        list = el(tag);
        if (tag === "ol" && item[2] !== "1") list.start = Number(item[2]);
        out.append(list);
      }
      const li = el("li");
      inline(li, item[3]);
      list.append(li);
      continue;
    }
    if (row.trim() === "") { flush(); list = null; continue; }
    if (list !== null && /^\s+\S/.test(row)) { // an item's continuation line
      const li = list.lastChild;
      li.append(el("br"));
      inline(li, row.trim());
      continue;
    }
    list = null;
    para.push(row);
  }
  flush();
  target.replaceChildren(out);
}

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

// -- JSON pointer deltas -> a preview value --------------------------------------------------
function tokens(pointer) {
  return pointer === "" ? [] : pointer.slice(1).split("/").map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}
function applyDelta(box, [path, op, value]) {
  const keys = tokens(path);
  if (keys.length === 0) {
    if (op === "set") box.root = value;
    else if (op === "append") box.root = (box.root || "") + value;
    return;
  }
  let parent = box.root;
  for (const key of keys.slice(0, -1)) {
    if (parent === null || typeof parent !== "object") return;
    parent = parent[key];
  }
  if (parent === null || typeof parent !== "object") return;
  const last = keys[keys.length - 1];
  if (op === "set") parent[last] = value;
  else if (op === "append") parent[last] = (parent[last] || "") + value;
}
// A tool's result (or its error message) on its card: the relay's redacted, bounded preview
// (one line here, ellipsised by CSS; the whole preview in the tooltip).
function showResult(card, d) {
  if (typeof d.result !== "string") return;
  let text = d.result;
  if (d.is_error && d.error && text.startsWith(d.error + ": ")) text = text.slice(d.error.length + 2);
  text = text.replace(/\s+/g, " ").trim();
  card.output.textContent = (d.is_error ? "error: " : "→ ") + text;
  card.output.title = text;
  card.output.classList.toggle("error", Boolean(d.is_error));
  card.output.hidden = false;
}

// A tool's UI payload (ToolOutcome.ui, redacted and bounded by the relay) on its card: a
// written file as its path and size, images (raster types, base64) as images, anything else
// as one line of JSON.
const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
function showUi(card, d) {
  const box = card.ui;
  box.replaceChildren();
  if (typeof d.ui_omitted === "number") {
    box.append(el("span", "omitted", `result view of ${d.ui_omitted} bytes, over the relay's limit`));
  } else if (d.ui !== undefined && d.ui !== null) {
    const ui = d.ui;
    if (ui && ui.kind === "file_written" && typeof ui.path === "string") {
      box.append(el("span", "file", `wrote ${ui.path}` + (Number.isFinite(ui.bytes) ? ` · ${ui.bytes} B` : "")));
    } else if (ui && Array.isArray(ui.images) && ui.images.length) {
      for (const image of ui.images.slice(0, 4)) {
        const type = String(image && image.mime_type).toLowerCase();
        const data = String(image && image.data);
        if (!IMAGE_TYPES.has(type) || !/^[A-Za-z0-9+/=\s]+$/.test(data)) continue;
        const img = el("img");
        img.alt = `image (${type})`;
        img.src = `data:${type};base64,${data.replace(/\s+/g, "")}`;
        box.append(img);
      }
    } else {
      const text = JSON.stringify(ui);
      box.append(el("code", null, text));
      box.title = text;
    }
  } else {
    return;
  }
  box.hidden = false;
}

// -- the view of one run ---------------------------------------------------------------------
// A failed call's card state: "unknown" when it may have had its effect (a worker or a
// server vanished mid-call), "cancelled" when it was stopped, "failed" otherwise.
function errorState(code) {
  if (code === "outcome_unknown") return "unknown";
  return code === "cancelled" ? "cancelled" : "failed";
}

class RunView {
  constructor(run, message, turn) {
    this.run = run;
    this.lastId = 0;
    this.cards = new Map();
    this.order = [];
    this.round = null;
    this.stopRequested = false;
    this.cancelledRound = false;
    this.turn = turn;
    this.turn.replaceChildren(el("div", "user", message));
    this.newRound(true);
  }

  newRound(thinking) {
    const box = el("div", "round");
    box.dataset.round = String(this.turn.querySelectorAll(".round").length + 1);
    const text = el("div", "text");
    this.round = { box, text, raw: "", drawn: 0, cards: el("div", "cards"), calls: [], thinking: null };
    box.append(text, this.round.cards);
    this.turn.append(box);
    if (thinking) this.think(true);
  }

  // "thinking…" while the model has said nothing yet: before the first token of the run and
  // between rounds (the page waits for the model's next answer); gone at its first output
  think(on) {
    const round = this.round;
    if (on && round.thinking === null) {
      round.thinking = el("div", "thinking", "thinking…");
      round.thinking.setAttribute("role", "status");
      round.box.prepend(round.thinking);
      document.body.dataset.thinking = round.box.dataset.round;
    } else if (!on && round.thinking !== null) {
      round.thinking.remove();
      round.thinking = null;
      document.body.dataset.thinking = "";
    }
  }

  // the round's text, as markdown, at most once an animation frame (and at the round's end)
  draw(now) {
    const round = this.round;
    if (round.drawn === round.raw.length) return;
    if (!now) {
      if (!round.pending) {
        round.pending = true;
        requestAnimationFrame(() => { round.pending = false; this.drawRound(round); });
      }
      return;
    }
    this.drawRound(round);
  }

  drawRound(round) {
    if (round.drawn === round.raw.length) return;
    round.drawn = round.raw.length;
    renderMarkdown(round.text, round.raw);
    this.scroll();
  }

  card(id, name) {
    let card = this.cards.get(id);
    // a card per round: a round asked again (a dead worker's attempt, closed) may reuse the
    // model's call ids, and its calls are new ones, shown (and joined) in the new round
    if (card && card.round !== this.round) card = undefined;
    if (!card) {
      this.think(false);
      const node = el("div", "card");
      node.dataset.callId = id;
      const head = el("div", "head");
      const title = el("span", "name", name || "?");
      const state = el("span", "state");
      head.append(title, state);
      const body = el("pre", "args");
      const foot = el("div", "foot");
      const output = el("div", "result");
      output.hidden = true;
      const ui = el("div", "ui");
      ui.hidden = true;
      node.append(head, el("div", "id", id), body, ui, output, foot);
      card = { node, title, state, body, output, ui, foot, preview: { root: undefined }, bytes: 0,
               started: null, ran: null, result: null, early: false, wasRunning: false,
               round: this.round };
      this.cards.set(id, card);
      this.round.calls.push(card);
      this.round.cards.append(node);
      this.setState(card, "streaming", "streaming");
    }
    if (name) card.title.textContent = name;
    return card;
  }

  setState(card, state, label) {
    card.node.dataset.state = state;
    card.state.textContent = label;
  }

  handle(type, data) {
    const handler = this["on_" + type];
    if (handler) handler.call(this, data);
  }

  on_text(d) { this.think(false); this.round.raw += d.text; this.draw(false); }

  on_call_opened(d) { if (d.id) this.card(d.id, d.name); }

  on_call_preview(d) {
    if (!d.id) return;
    const card = this.card(d.id, d.name);
    if (card.node.dataset.state !== "streaming") return; // a preview never moves a call back
    for (const delta of d.deltas) applyDelta(card.preview, delta);
    card.bytes = d.bytes;
    const shown = card.preview.root === undefined ? "…" : JSON.stringify(card.preview.root, null, 1);
    card.body.textContent = shown;
    card.foot.textContent = `${d.bytes} B of arguments` + (d.error ? ` · preview stopped: ${d.error}` : "");
    card.node.classList.add("preview");
  }

  on_call_committed(d) {
    const card = this.card(d.id, d.name);
    card.early = d.early;
    card.node.classList.remove("preview");
    card.body.textContent = JSON.stringify(d.arguments, null, 1);
    this.setState(card, "committed", d.early ? "committed (early)" : "committed");
    card.foot.textContent = "";
    this.gate(d.id, d.name, "committed", d.early
      ? "eager tool; the provider moved on from the call, strictly parsed, schema-valid"
      : "the round ended normally; strictly parsed, schema-valid, allowed");
  }

  // a call that waits for a person: the FULL committed arguments (never the preview) and
  // Approve / Deny, answered with the signed token the event carries
  on_approval_requested(d) {
    const card = this.card(d.id, d.name);
    card.node.classList.remove("preview");
    card.body.textContent = JSON.stringify(d.arguments, null, 1);
    this.setState(card, "awaiting", "awaiting approval");
    card.foot.textContent = "the model asked for this call; it runs only if you approve";
    const box = el("div", "approval");
    const approve = el("button", "approve", "Approve");
    const always = el("button", "always", "Always (this session)");
    always.title = `run every later call of ${d.name} in this browser session without asking`;
    const deny = el("button", "deny", "Deny");
    approve.type = always.type = deny.type = "button";
    const answer = async (action, body) => {
      approve.disabled = always.disabled = deny.disabled = true;
      const url = `/runs/${encodeURIComponent(this.run.id)}/calls/${encodeURIComponent(d.id)}/${action}`;
      const response = await fetch(url, {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ token: d.token, ...body }),
      });
      if (!response.ok) {
        const error = (await response.json().catch(() => ({}))).error || {};
        card.foot.textContent = `not answered: ${error.code || response.status} ${error.message || ""}`;
        approve.disabled = always.disabled = deny.disabled = error.code === "already_answered";
      } else if (body.always) showAlways();
    };
    approve.addEventListener("click", () => answer("approve", {}));
    always.addEventListener("click", () => answer("approve", { always: true }));
    deny.addEventListener("click", () => answer("deny", { reason: "denied on the page" }));
    box.append(approve, always, deny);
    card.approval = box;
    card.node.insertBefore(box, card.foot);
  }

  on_client_call(d) {
    const card = this.card(d.id, d.name);
    card.body.textContent = JSON.stringify(d.arguments, null, 1);
    this.setState(card, "awaiting", "awaiting the client");
    card.foot.textContent = "a client tool: its result comes from the client that runs it";
  }

  on_approval_answered(d) {
    const card = this.card(d.id, d.name);
    if (card.approval) card.approval.remove();
    card.approval = null;
    this.setState(card, d.decision === "approved" ? "committed" : "awaiting", d.decision);
    card.foot.textContent = d.decision + (d.reason ? `: ${d.reason}` : "") + (d.edited ? " (edited)" : "");
  }

  on_call_failed(d) {
    const card = this.card(d.id, d.name);
    if (card.node.classList.contains("preview")) {
      // what the preview shows was rebuilt leniently from the stream: the gate checked the
      // call's complete text, and refused it; the preview may look valid all the same
      card.body.classList.add("unchecked");
      card.node.insertBefore(el("div", "unchecked-note", "preview of the streamed arguments, not what the gate checked"), card.body);
    }
    card.node.classList.remove("preview");
    card.result = { is_error: true, error: d.error };
    this.setState(card, errorState(d.error), d.error);
    card.foot.textContent = d.detail;
    this.gate(d.id, d.name, "failed " + d.error, d.detail);
  }

  on_tool_started(d) {
    const card = this.card(d.id, d.name);
    card.started = performance.now();
    card.wasRunning = true;
    this.setState(card, "running", "running");
  }

  on_tool_finished(d) {
    const card = this.card(d.id, d.name);
    if (card.started !== null) card.ran = performance.now() - card.started;
    card.result = { is_error: d.is_error, error: d.error, truncated_from: d.truncated_from };
    card.started = null;
    showUi(card, d);
    showResult(card, d);
    this.setState(card, "finished", "finished");
    card.foot.textContent = "result in, waiting for the round";
  }

  on_round_ended(d) {
    this.think(false);
    this.draw(true);
    // results are shown in call order, once the round has joined
    for (const card of this.round.calls) {
      const result = card.result;
      if (result === null) continue;
      card.node.classList.add("final");
      if (!result.is_error) this.setState(card, "done", "done");
      else this.setState(card, errorState(result.error), result.error || "error");
      card.foot.textContent = card.ran === null ? card.foot.textContent : `ran ${Math.round(card.ran)} ms`;
      if (result.truncated_from) card.foot.textContent += ` · result cut from ${result.truncated_from} bytes`;
      if (result.error === "cancelled") {
        card.foot.textContent = card.wasRunning
          ? "stopped while running: it may already have had its effect"
          : "stopped before it ran";
      }
    }
    this.cancelledRound = this.cancelledRound || d.ended === "cancelled";
    this.round.box.append(el("div", "meta", `round ${d.round} · ${d.ended}` + (d.stop_reason ? ` (${d.stop_reason})` : "")));
    // the model is asked again after a round with calls (or a broken stream), unless stopped
    const again = (this.round.calls.length > 0 || d.ended === "interrupted")
      && d.ended !== "cancelled" && !this.stopRequested;
    this.newRound(again);
  }

  on_lagged(d) {
    // the relay forgot events this page had not read (it keeps a bounded log per run)
    const what = `${d.missed} earlier event${d.missed === 1 ? "" : "s"} no longer kept by the relay`;
    this.turn.insertBefore(el("div", "meta lagged", what), this.round.box); // (kept at run_ended)
  }

  on_run_ended(d) {
    this.think(false);
    this.round.box.remove();
    this.done = true;
    const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
    // stopped, one way: asked here, or (replayed) a round or a call the stop cancelled
    const stopped = this.stopRequested || this.cancelledRound
      || d.calls.some((c) => c.error === "cancelled");
    const summary = `${plural(d.rounds, "round")} · ${plural(d.calls.length, "call")}`;
    if (d.error) setStatus("error", "model error: " + d.error);
    else if (stopped) setStatus("stopped", `stopped · ${summary}`);
    else setStatus("finished", `finished · ${summary}`);
    this.turn.dataset.ended = stopped ? "stopped" : d.error ? "error" : "finished";
    finish();
  }

  // the relay no longer has the run (it keeps a bounded number of runs) or refused the stream
  gone() {
    this.think(false);
    this.round.box.remove();
    this.done = true;
    this.turn.append(el("div", "meta gone", "this exchange is no longer kept by the relay"));
    finish();
  }

  gate(id, name, decision, reason) {
    const item = el("li", decision.startsWith("committed") ? "committed" : "failed");
    item.dataset.callId = id;
    item.append(el("span", "decision", decision.toUpperCase()), document.createTextNode(` ${name || "?"} `),
                el("div", "id", id), el("div", "reason", reason));
    $("gatelog").append(item);
  }

  tick() {
    const now = performance.now();
    for (const card of this.cards.values()) {
      if (card.started !== null) card.foot.textContent = `running ${((now - card.started) / 1000).toFixed(1)} s`;
    }
  }

  scroll() { const t = $("transcript"); t.scrollTop = t.scrollHeight; }
}

// -- the chat --------------------------------------------------------------------------------
// The thread is kept here (sessionStorage, this tab): its chat_id, sent with every POST /runs
// so the relay can key a server-side history by it, and its runs, replayed in order on a
// reload. "New chat" starts a new chat_id and an empty thread.
let chat = null;
let source = null;
const queue = []; // runs to follow, in order (a reload replays the whole thread)

function newChatId() {
  const bytes = crypto.getRandomValues(new Uint8Array(18));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
}

function loadChat() {
  let stored = null;
  try { stored = JSON.parse(sessionStorage.getItem(STORE) || "null"); } catch { stored = null; }
  if (!stored || typeof stored.chat_id !== "string" || !Array.isArray(stored.runs)) {
    stored = { chat_id: newChatId(), runs: [] };
  }
  const legacy = sessionStorage.getItem(LEGACY);
  if (legacy) { // a run stored as one page run was (tests and older tabs): it joins the thread
    try { stored.runs.push(JSON.parse(legacy)); } catch { /* not a run */ }
    sessionStorage.removeItem(LEGACY);
  }
  return stored;
}

function saveChat() {
  chat.runs = chat.runs.slice(-MAX_THREAD);
  // the session token stays in its HttpOnly cookie: only the runs' URLs are kept here
  sessionStorage.setItem(STORE, JSON.stringify(chat));
}

function busy(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
  $("newchat").disabled = running;
}

function enqueue(run) {
  const turn = el("div", "turn");
  $("transcript").append(turn);
  queue.push({ run, turn });
  if (source === null) next();
}

function next() {
  const item = queue.shift();
  if (!item) {
    document.body.dataset.run = view ? "ended" : "idle";
    busy(false);
    return;
  }
  follow(item.run, item.turn);
}

function follow(run, turn) {
  view = new RunView(run, run.message, turn);
  setStatus("running", "running");
  document.body.dataset.run = "running";
  busy(true);
  const current = view;
  source = new EventSource(run.events_url);
  const types = ["text", "call_opened", "call_preview", "call_committed", "call_failed",
                 "tool_started", "tool_finished", "round_ended", "run_ended", "lagged",
                 "approval_requested", "client_call", "approval_answered"];
  for (const type of types) {
    source.addEventListener(type, (e) => {
      const id = Number(e.lastEventId);
      if (current.done || id <= current.lastId) return; // never apply an event twice
      current.lastId = id;
      document.body.dataset.lastEventId = String(id);
      current.handle(type, JSON.parse(e.data));
    });
  }
  const stream = source;
  source.onerror = () => {
    if (current.done) return;
    if (stream.readyState === EventSource.CLOSED) current.gone(); // 404, 429: no retry
    else setStatus("running", "reconnecting…");
  };
  source.onopen = () => { if (!current.done) setStatus("running", "running"); };
}

function finish() {
  if (source) source.close();
  source = null;
  next();
}

async function send(event) {
  event.preventDefault();
  const box = $("message");
  const message = box.value.trim();
  if (!message || source !== null) return;
  $("send").disabled = true;
  let response;
  let body;
  try {
    response = await fetch("/runs", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ message, chat_id: chat.chat_id }),
    });
    body = await response.json();
  } catch (exc) {
    setStatus("error", `the relay could not be reached: ${exc}`);
    $("send").disabled = false;
    return;
  }
  if (!response.ok) {
    setStatus("error", body && body.error ? body.error.message : `HTTP ${response.status}`);
    $("send").disabled = false;
    return;
  }
  box.value = "";
  const { id, events_url, cancel_url } = body;
  const run = { id, events_url, cancel_url, message };
  chat.runs.push(run);
  saveChat();
  enqueue(run);
}

async function stop() {
  if (!view || view.done) return;
  view.stopRequested = true;
  $("stop").disabled = true;
  setStatus("running", "stopping…");
  await fetch(view.run.cancel_url, {
    method: "POST", headers: { "content-type": "application/json" }, body: "{}",
  });
}

// the tools this browser session always allows (kept by the relay), each with a revoke button
async function showAlways() {
  const response = await fetch("/session/approvals").catch(() => null);
  const names = response && response.ok ? (await response.json()).always : [];
  const box = $("always");
  box.replaceChildren(...(names.length ? [el("span", "", "always allowed:")] : []));
  for (const name of names) {
    const revoke = el("button", "revoke", `${name} ×`);
    revoke.type = "button";
    revoke.title = `ask again before ${name} runs`;
    revoke.dataset.tool = name;
    revoke.addEventListener("click", async () => {
      revoke.disabled = true;
      await fetch(`/session/approvals/${encodeURIComponent(name)}`, { method: "DELETE" });
      showAlways();
    });
    box.append(revoke);
  }
}

function newChat() {
  if (source !== null) return;
  chat = { chat_id: newChatId(), runs: [] };
  saveChat();
  document.body.dataset.chatId = chat.chat_id;
  view = null;
  $("transcript").replaceChildren();
  $("gatelog").replaceChildren();
  document.body.dataset.run = "idle";
  setStatus("idle", "idle");
  $("message").focus();
}

window.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", send);
  $("message").addEventListener("keydown", (e) => { // Enter sends, Shift+Enter is a new line
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", stop);
  $("newchat").addEventListener("click", newChat);
  setInterval(() => view && view.tick(), 100);
  chat = loadChat();
  saveChat();
  document.body.dataset.chatId = chat.chat_id;
  for (const run of chat.runs) enqueue(run); // a reload: replay the thread, in order
  showAlways();
});
