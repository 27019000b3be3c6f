// The relay page: one run at a time, rebuilt from the run's SSE events (so a reload replays
// the stored events from the start and shows the same view; EventSource resumes a dropped
// connection by itself with Last-Event-ID). Everything shown goes through textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "toollatch.run";
let view = null;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
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

// -- the view of one run ---------------------------------------------------------------------
// A failed call's card state: "unknown" when it may have had its effect (a worker or a
// server vanished mid-call), "cancelled" when it was stopped, "failed" otherwise.
function errorState(code) {
  if (code === "outcome_unknown") return "unknown";
  return code === "cancelled" ? "cancelled" : "failed";
}

class RunView {
  constructor(run, message) {
    this.run = run;
    this.lastId = 0;
    this.cards = new Map();
    this.order = [];
    this.round = null;
    this.turn = el("div", "turn");
    this.turn.append(el("div", "user", message));
    $("transcript").append(this.turn);
    this.newRound();
  }

  newRound() {
    const box = el("div", "round");
    box.dataset.round = String(this.turn.querySelectorAll(".round").length + 1);
    this.round = { box, text: el("div", "text"), cards: el("div", "cards"), calls: [] };
    box.append(this.round.text, this.round.cards);
    this.turn.append(box);
  }

  card(id, name) {
    let card = this.cards.get(id);
    if (!card) {
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
      node.append(head, el("div", "id", id), body, output, foot);
      card = { node, title, state, body, output, foot, preview: { root: undefined }, bytes: 0,
               started: null, ran: null, result: null, early: false };
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

  on_text(d) { this.round.text.textContent += d.text; this.scroll(); }

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
    this.setState(card, "running", "running");
  }

  on_tool_finished(d) {
    const card = this.card(d.id, d.name);
    if (card.started !== null) card.ran = performance.now() - card.started;
    card.result = { is_error: d.is_error, error: d.error, truncated_from: d.truncated_from };
    card.started = null;
    showResult(card, d);
    this.setState(card, "finished", "finished");
    card.foot.textContent = "result in, waiting for the round";
  }

  on_round_ended(d) {
    // results are shown in call order, once the round has joined
    for (const card of this.round.calls) {
      const result = card.result;
      if (result === null) continue;
      card.node.classList.add("final");
      if (!result.is_error) this.setState(card, "done", "done");
      else this.setState(card, errorState(result.error), result.error || "error");
      card.foot.textContent = card.ran === null ? card.foot.textContent : `ran ${Math.round(card.ran)} ms`;
      if (result.truncated_from) card.foot.textContent += ` · result cut from ${result.truncated_from} bytes`;
    }
    this.stopped = d.ended === "cancelled";
    this.round.box.append(el("div", "meta", `round ${d.round} · ${d.ended}` + (d.stop_reason ? ` (${d.stop_reason})` : "")));
    this.newRound();
  }

  on_lagged(d) {
    // the relay forgot events this page had not read (it keeps a bounded log per run)
    const what = `${d.missed} earlier event${d.missed === 1 ? "" : "s"} no longer kept by the relay`;
    this.turn.insertBefore(el("div", "meta lagged", what), this.round.box); // (kept at run_ended)
  }

  on_run_ended(d) {
    this.round.box.remove();
    this.done = true;
    const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
    const how = this.stopped ? "stopped" : "finished";
    if (d.error) setStatus("error", "model error: " + d.error);
    else setStatus("finished", `${how} · ${plural(d.rounds, "round")} · ${plural(d.calls.length, "call")}`);
    document.body.dataset.run = "ended";
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

// -- wiring ----------------------------------------------------------------------------------
let source = null;

function follow(run, message) {
  view = new RunView(run, message);
  setStatus("running", "running");
  document.body.dataset.run = "running";
  $("send").disabled = true;
  $("stop").disabled = false;
  source = new EventSource(run.events_url);
  const types = ["text", "call_opened", "call_preview", "call_committed", "call_failed",
                 "tool_started", "tool_finished", "round_ended", "run_ended", "lagged"];
  for (const type of types) {
    source.addEventListener(type, (e) => {
      const id = Number(e.lastEventId);
      if (id <= view.lastId) return; // never apply an event twice
      view.lastId = id;
      document.body.dataset.lastEventId = String(id);
      view.handle(type, JSON.parse(e.data));
    });
  }
  source.onerror = () => { if (!view.done) setStatus("running", "reconnecting…"); };
  source.onopen = () => { if (!view.done) setStatus("running", "running"); };
}

function finish() {
  if (source) source.close();
  source = null;
  $("send").disabled = false;
  $("stop").disabled = true;
}

async function send(event) {
  event.preventDefault();
  const message = $("message").value.trim();
  if (!message) return;
  const response = await fetch("/runs", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ message }),
  });
  const body = await response.json();
  if (!response.ok) { setStatus("error", body.error.message); return; }
  // the session token stays in its HttpOnly cookie: only the run's URLs are kept here
  const { id, events_url, cancel_url } = body;
  sessionStorage.setItem(STORE, JSON.stringify({ id, events_url, cancel_url, message }));
  $("transcript").replaceChildren();
  $("gatelog").replaceChildren();
  follow(body, message);
}

async function stop() {
  if (!view) return;
  $("stop").disabled = true;
  setStatus("running", "stopping…");
  await fetch(view.run.cancel_url, {
    method: "POST", headers: { "content-type": "application/json" }, body: "{}",
  });
}

window.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", stop);
  setInterval(() => view && view.tick(), 100);
  const saved = sessionStorage.getItem(STORE);
  if (saved) { const run = JSON.parse(saved); follow(run, run.message); } // a reload: replay
});
