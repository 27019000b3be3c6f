// The AI SDK's own Chat (ai 6.0.326: AbstractChat with a plain in-memory state, what useChat
// wraps) with DefaultChatTransport against `POST /api/chat` of a running relay
// (tests/test_relay_approvals.py): it sends one message; onToolCall answers the client tool
// with addToolOutput; once the first stream ends (the run waits), addToolApprovalResponse
// approves and denies the calls named in the config; sendAutomaticallyWhen
// (lastAssistantMessageIsCompleteWithApprovalResponses) then posts the answers.
//
// With "askedFile" and "goFile" (tests/test_relay_restore.py): once the first stream ends
// it creates askedFile, waits for goFile and sends its answers to the relay URL goFile holds
// (the relay was restarted meanwhile).
//
// Usage: node ui_message_approvals.mjs '{"url", "session", "chatId", "text", "model",
//   "clientTool", "clientOutput", "approve": [call ids], "deny": [call ids],
//   "askedFile"?, "goFile"?}'
// Prints {"messages", "requests", "status", "error", "toolCalls"}.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

const config = JSON.parse(process.argv[2]);

class MemoryState {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class NodeChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new MemoryState() });
  }
}

let requests = 0;
let relayUrl = config.url;
const toolCalls = [];
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  headers: { "x-toollatch-session": config.session },
  body: { model: config.model },
  fetch: async (input, init) => {
    requests += 1;
    return fetch(String(input).replace(config.url, relayUrl), init);
  },
});

const chat = new NodeChat({
  id: config.chatId,
  transport,
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onToolCall: async ({ toolCall }) => {
    toolCalls.push(toolCall.toolName);
    if (toolCall.toolName === config.clientTool) {
      chat.addToolOutput({
        tool: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        output: config.clientOutput,
      });
    }
  },
});

async function settled() {
  for (let i = 0; i < 600 && chat.status !== "ready" && chat.status !== "error"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

await chat.sendMessage({ text: config.text });
await settled();
if (config.goFile) {
  writeFileSync(config.askedFile, "asked");
  for (let i = 0; i < 2400 && !existsSync(config.goFile); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  relayUrl = readFileSync(config.goFile, "utf8").trim();
}
for (const id of config.approve) await chat.addToolApprovalResponse({ id: approvalIdOf(id), approved: true });
for (const id of config.deny) {
  await chat.addToolApprovalResponse({ id: approvalIdOf(id), approved: false, reason: "no, thanks" });
}
await settled();

function approvalIdOf(callId) {
  const last = chat.messages[chat.messages.length - 1];
  const part = last.parts.find((p) => p.toolCallId === callId);
  if (!part || !part.approval) throw new Error(`no approval request for ${callId}: ${JSON.stringify(last.parts)}`);
  return part.approval.id;
}

console.log(
  JSON.stringify({
    messages: chat.messages,
    requests,
    status: chat.status,
    error: chat.error ? String(chat.error) : null,
    toolCalls,
  }),
);
