// Drives `POST /agui` of a running `toollatch serve` with the real AG-UI client (tests/test_agui.py).
//
// Usage: node tests/js/agui_client.mjs '<json>' with {"url", "session", "runs": [{"threadId", "runId",
// "messages": [text, ...], "forwardedProps"?, "lastEventId"?}]}. Runs of one threadId share one
// HttpAgent (so the client sends back its whole thread, as a chat frontend does). Each run goes
// through `HttpAgent.runAgent`, which applies `verifyEvents`; each event on the wire is also
// validated against `@ag-ui/core`'s `EventSchema`, and any key its type's schema does not define
// is reported. Prints one JSON object: {"runs": [{"ok", "error", "relayRun", "wire": [events],
// "problems": [...], "messages": [the agent's messages after the run]}]}.
import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const config = JSON.parse(process.argv[2]);
const shapes = new Map(
  EventSchema.options.map((schema) => [schema.shape.type.value, new Set(Object.keys(schema.shape))]),
);

function wireEvents(text) {
  // the SSE body as the client's parser reads it: blocks split on a blank line, `data:` lines only
  const events = [];
  for (const block of text.split("\n\n")) {
    const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
    if (data.length) events.push(JSON.parse(data.join("\n")));
  }
  return events;
}

function problemsOf(events) {
  const problems = [];
  events.forEach((event, i) => {
    const parsed = EventSchema.safeParse(event);
    if (!parsed.success) problems.push(`event ${i} (${event.type}): ${parsed.error.message}`);
    const known = shapes.get(event.type);
    for (const key of Object.keys(event)) {
      if (known && !known.has(key)) problems.push(`event ${i} (${event.type}): key ${key} is not in its schema`);
    }
  });
  return problems;
}

const agents = new Map();
const results = [];
for (const run of config.runs) {
  let captured = { text: "", relayRun: null, status: null };
  const headers = { "X-Toollatch-Session": config.session };
  if (run.lastEventId !== undefined) headers["Last-Event-ID"] = String(run.lastEventId);
  const fetchWithCopy = async (url, init) => {
    const response = await fetch(url, init);
    captured.status = response.status;
    captured.relayRun = response.headers.get("x-toollatch-run");
    captured.pending = response.clone().text().then((t) => (captured.text = t));
    return response;
  };
  let agent = agents.get(run.threadId);
  if (!agent || run.lastEventId !== undefined) {
    agent = new HttpAgent({ url: `${config.url}/agui`, headers, threadId: run.threadId, fetch: fetchWithCopy });
    if (run.lastEventId === undefined) agents.set(run.threadId, agent);
  }
  agent.fetch = fetchWithCopy;
  for (const [i, text] of run.messages.entries()) {
    agent.addMessage({ id: `${run.runId}-user-${i}`, role: "user", content: text });
  }
  let ok = true;
  let error = null;
  try {
    await agent.runAgent({ runId: run.runId, forwardedProps: run.forwardedProps ?? {} });
  } catch (exc) {
    ok = false;
    error = String(exc?.message ?? exc);
  }
  if (captured.pending) await captured.pending;
  const wire = wireEvents(captured.text);
  results.push({
    ok,
    error,
    status: captured.status,
    relayRun: captured.relayRun,
    wire,
    problems: problemsOf(wire),
    messages: agent.messages,
  });
}
console.log(JSON.stringify({ runs: results }));
