// useChat's own chat logic (ai 6.0.326's AbstractChat, the class useChat wraps, over
// DefaultChatTransport) against `toollatch serve`'s POST /api/chat: sendMessage() then
// regenerate(), the calls a useChat app makes. Prints one JSON line:
// {"first": messages after sendMessage, "second": messages after regenerate, "status", "error"}.
//
//   node ui_message_chat.mjs URL SESSION CHAT_ID TEXT MODEL
import { AbstractChat, DefaultChatTransport } from "ai";

const [url, session, chatId, text, model] = process.argv.slice(2);

// The state useChat keeps in React, kept in a plain array (ChatState in ai's index.d.ts).
class PlainState {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class PlainChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new PlainState() });
  }
}

const chat = new PlainChat({
  id: chatId,
  transport: new DefaultChatTransport({
    api: `${url}/api/chat`,
    headers: { "x-toollatch-session": session },
    body: { model },
  }),
});

async function main() {
  await chat.sendMessage({ text });
  const first = structuredClone(chat.messages);
  if (chat.status !== "ready") throw new Error(`after sendMessage: ${chat.status} ${chat.error}`);
  await chat.regenerate();
  const second = structuredClone(chat.messages);
  const error = chat.error ? String(chat.error.message ?? chat.error) : null;
  process.stdout.write(JSON.stringify({ first, second, status: chat.status, error }) + "\n");
}

main().catch((error) => {
  process.stderr.write(`${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
