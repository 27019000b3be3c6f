// The Vercel AI SDK's own client against `toollatch serve`'s POST /api/chat (ai 6.0.326):
// DefaultChatTransport (which parses the SSE and validates every chunk against
// uiMessageChunkSchema, throwing on the first invalid one) feeding readUIMessageStream (the
// message assembly useChat uses). Prints one JSON line: {"message", "chunks", "resumed"}.
//
//   node ui_message_client.mjs URL SESSION CHAT_ID TEXT MODEL PROVIDER MODE
//
// MODE "send": one request read to its end. MODE "drop:N": the request's connection is dropped
// after N chunks, then GET /api/chat/{id}/stream (reconnectToStream) is read to its end.
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [url, session, chatId, text, model, provider, mode] = process.argv.slice(2);
const transport = new DefaultChatTransport({
  api: `${url}/api/chat`,
  headers: { "x-toollatch-session": session },
  body: { model, ...(provider ? { provider } : {}) },
});
const userMessage = { id: `u-${Date.now()}`, role: "user", parts: [{ type: "text", text }] };
const chunks = [];

function recorded(stream, limit, onLimit) {
  return stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(chunk);
        controller.enqueue(chunk);
        if (limit !== undefined && chunks.length >= limit) onLimit();
      },
    }),
  );
}

async function lastMessage(stream) {
  let message;
  for await (const snapshot of readUIMessageStream({
    stream,
    terminateOnError: true,
  })) {
    message = snapshot;
  }
  return message;
}

async function main() {
  const abort = new AbortController();
  const drop = mode.startsWith("drop:") ? Number(mode.slice(5)) : undefined;
  const stream = await transport.sendMessages({
    chatId,
    messages: [userMessage],
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: abort.signal,
  });
  let message;
  let resumed = false;
  if (drop === undefined) {
    message = await lastMessage(recorded(stream));
  } else {
    try {
      await lastMessage(recorded(stream, drop, () => abort.abort()));
    } catch (error) {
      if (error.name !== "AbortError") throw error;
    }
    chunks.length = 0;
    const again = await transport.reconnectToStream({ chatId });
    if (again === null) throw new Error("nothing to resume (204)");
    resumed = true;
    message = await lastMessage(recorded(again));
  }
  process.stdout.write(JSON.stringify({ message, chunks, resumed }) + "\n");
}

main().catch((error) => {
  process.stderr.write(`${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
