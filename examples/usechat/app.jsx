// A chat page on the Vercel AI SDK's useChat (@ai-sdk/react), backed by `toollatch serve`'s
// POST /api/chat. Build: node examples/usechat/build.mjs (esbuild, from the repo's node_modules);
// serve the built index.html and app.js from the relay's origin.
//
// Human approval (ai 6.0.326, node_modules/ai/dist/index.d.ts): a call the relay holds for a
// person arrives as a tool part in state "approval-requested"; its card shows the tool's name
// and full input with Approve / Deny, which call addToolApprovalResponse. A client tool (one the
// server declares without a body, here get_location) reaches onToolCall and is answered with
// addToolOutput. sendAutomaticallyWhen then posts the answers in the next POST /api/chat, and
// the relay's run goes on in the same assistant message.
import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} from "ai";
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

// The tools this page runs itself, by name: the input in, the output back to the run.
const clientTools = {
  get_location: () =>
    new Promise((resolve, reject) =>
      navigator.geolocation.getCurrentPosition(
        ({ coords }) => resolve({ latitude: coords.latitude, longitude: coords.longitude }),
        (error) => reject(new Error(error.message || "location unavailable")),
        { timeout: 10_000 },
      ),
    ),
};

// Post once every call of the last step is answered: by a person, or by the page.
const answered = (options) =>
  lastAssistantMessageIsCompleteWithApprovalResponses(options) ||
  lastAssistantMessageIsCompleteWithToolCalls(options);

function ToolCard({ part, onApproval }) {
  const name = part.type === "dynamic-tool" ? part.toolName : part.type.slice("tool-".length);
  const asked = part.state === "approval-requested";
  return (
    <div className="card" data-call-id={part.toolCallId} data-state={part.state} data-tool={name}>
      <b className="name">{name}</b> <span className="state">{part.state}</span>
      {part.input !== undefined && (
        <pre className="input">{JSON.stringify(part.input, null, asked ? 2 : undefined)}</pre>
      )}
      {asked && (
        <p className="approval">
          <button className="approve" onClick={() => onApproval(part, true)}>Approve</button>{" "}
          <button className="deny" onClick={() => onApproval(part, false)}>Deny</button>
        </p>
      )}
      {part.state === "output-available" && <pre className="output">{JSON.stringify(part.output)}</pre>}
      {part.errorText && <p className="error">{part.errorText}</p>}
    </div>
  );
}

function Chat() {
  const [text, setText] = useState("");
  const { messages, sendMessage, status, stop, addToolApprovalResponse, addToolOutput } = useChat({
    id: chatId,
    transport: new DefaultChatTransport({ api: "/api/chat", body: model ? { model } : {} }),
    resume: true,
    sendAutomaticallyWhen: answered,
    async onToolCall({ toolCall }) {
      const run = clientTools[toolCall.toolName];
      if (!run) return; // (a server tool: the relay runs it)
      const { toolName: tool, toolCallId } = toolCall;
      try {
        addToolOutput({ tool, toolCallId, output: await run(toolCall.input) });
      } catch (error) {
        addToolOutput({ tool, toolCallId, state: "output-error", errorText: String(error.message) });
      }
    },
  });
  const onApproval = (part, approved) =>
    addToolApprovalResponse({
      id: part.approval.id,
      approved,
      ...(approved ? {} : { reason: "denied on the page" }),
    });
  return (
    <main data-status={status}>
      {messages.map((message) => (
        <section key={message.id} className={message.role}>
          {message.parts.map((part, i) =>
            part.type === "text" ? (
              <p key={i} className="text">{part.text}</p>
            ) : part.type.startsWith("tool-") || part.type === "dynamic-tool" ? (
              <ToolCard key={part.toolCallId} part={part} onApproval={onApproval} />
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
