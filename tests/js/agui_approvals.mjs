// AG-UI's own HttpAgent (@ag-ui/client 1.0.0) against `POST /agui` of a running relay
// (tests/test_relay_approvals.py): run 1 sends a user message with a frontend tool; it ends
// (RUN_FINISHED) while the relay's run waits, with an interrupt outcome for a call that needs a
// person. Run 2 carries a tool message for the frontend tool's call and a resume entry per
// interrupt (approved or not, as configured). Every event of both runs passes the client's
// verifyEvents (runAgent throws otherwise) and EventSchema.
//
// "editedArgs": the approval's payload.editedArgs. With "askedFile" and "goFile"
// (tests/test_relay_restore.py): after run 1 it creates askedFile, waits for goFile and sends
// run 2 to the relay URL goFile holds (the relay was restarted meanwhile).
//
// Usage: node agui_approvals.mjs '{"url", "session", "threadId", "text", "model", "tool",
//   "clientOutput", "approved", "editedArgs"?, "askedFile"?, "goFile"?}'. Prints {"runs": [{"ok", "error", "wire", "problems",
//   "relayRun"}], "interrupts",
//   "messages"}.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const config = JSON.parse(process.argv[2]);
let captured = null;
let relayRun = null;
const agent = new HttpAgent({
  url: `${config.url}/agui`,
  headers: { "X-Toollatch-Session": config.session },
  threadId: config.threadId,
});
let relayUrl = config.url;
agent.fetch = async (url, init) => {
  const response = await fetch(String(url).replace(config.url, relayUrl), init);
  captured = response.clone().text();
  relayRun = response.headers.get("x-toollatch-run");
  return response;
};

function wireEvents(text) {
  const events = [];
  for (const block of text.split("\n\n")) {
    const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
    if (data.length) events.push(JSON.parse(data.join("\n")));
  }
  return events;
}

async function run(params) {
  let ok = true;
  let error = null;
  try {
    await agent.runAgent({ tools: [config.tool], forwardedProps: { model: config.model }, ...params });
  } catch (exc) {
    ok = false;
    error = String(exc?.message ?? exc);
  }
  const wire = wireEvents(captured ? await captured : "");
  const problems = wire.flatMap((e, i) => {
    const parsed = EventSchema.safeParse(e);
    return parsed.success ? [] : [`event ${i} (${e.type}): ${parsed.error.message}`];
  });
  return { ok, error, wire, problems, relayRun };
}

agent.addMessage({ id: "u-1", role: "user", content: config.text });
const first = await run({ runId: "run-1" });
const finished = first.wire.find((e) => e.type === "RUN_FINISHED");
const interrupts = finished?.outcome?.type === "interrupt" ? finished.outcome.interrupts : [];
for (const message of agent.messages) {
  for (const call of message.toolCalls ?? []) {
    if (call.function.name === config.tool.name) {
      agent.addMessage({ id: `t-${call.id}`, role: "tool", toolCallId: call.id, content: config.clientOutput });
    }
  }
}
const resume = interrupts.map((i) => ({
  interruptId: i.id,
  status: "resolved",
  payload: config.approved
    ? { approved: true, ...(config.editedArgs ? { editedArgs: config.editedArgs } : {}) }
    : { approved: false, reason: "not now" },
}));
if (config.goFile) {
  writeFileSync(config.askedFile, "asked");
  for (let i = 0; i < 2400 && !existsSync(config.goFile); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  relayUrl = readFileSync(config.goFile, "utf8").trim();
}
const second = await run({ runId: "run-2", resume });
console.log(JSON.stringify({ runs: [first, second], messages: agent.messages, interrupts }));
