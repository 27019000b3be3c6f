// A chat page on the Vercel AI SDK's useChat (@ai-sdk/react), backed by `toollatch serve`'s
// POST /api/chat. Build: node examples/usechat/build.mjs (esbuild, from the repo's node_modules);
// serve the built index.html and app.js from the relay's origin.
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport } from "ai";
import { useState } from "react";
import { createRoot } from "react-dom/client";

// One chat per tab, kept across reloads, so that useChat({ resume: true }) finds its stream.
const chatId =
  sessionStorage.getItem("usechat.id") ??
  (() => {
    const id = `chat-${crypto.randomUUID()}`;
    sessionStorage.setItem("usechat.id", id);
    return id;
  })();

// ?model=NAME picks the relay's model (the scripted server's script names, or --allow-model).
const model = new URLSearchParams(location.search).get("model");

function ToolCard({ part }) {
  const name = part.type === "dynamic-tool" ? part.toolName : part.type.slice("tool-".length);
  return (
    <div className="card" data-call-id={part.toolCallId} data-state={part.state}>
      <b>{name}</b> <span className="state">{part.state}</span>
      {part.input !== undefined && <pre className="input">{JSON.stringify(part.input)}</pre>}
      {part.state === "output-available" && <pre className="output">{JSON.stringify(part.output)}</pre>}
      {part.errorText && <p className="error">{part.errorText}</p>}
    </div>
  );
}

function Chat() {
  const [text, setText] = useState("");
  const { messages, sendMessage, status, stop } = useChat({
    id: chatId,
    transport: new DefaultChatTransport({ api: "/api/chat", body: model ? { model } : {} }),
    resume: true,
  });
  return (
    <main data-status={status}>
      {messages.map((message) => (
        <section key={message.id} className={message.role}>
          {message.parts.map((part, i) =>
            part.type === "text" ? (
              <p key={i} className="text">{part.text}</p>
            ) : part.type.startsWith("tool-") || part.type === "dynamic-tool" ? (
              <ToolCard key={part.toolCallId} part={part} />
            ) : null,
          )}
        </section>
      ))}
      <form
        onSubmit={(event) => {
          event.preventDefault();
          if (text.trim()) sendMessage({ text });
          setText("");
        }}
      >
        <input id="message" value={text} onChange={(e) => setText(e.target.value)} />
        <button id="send" type="submit" disabled={status === "streaming" || status === "submitted"}>
          Send
        </button>
        <button id="stop" type="button" onClick={() => stop()}>Stop</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
