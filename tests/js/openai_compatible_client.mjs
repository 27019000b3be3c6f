// The AI SDK's OpenAI-compatible provider (@ai-sdk/openai-compatible + `ai`'s streamText) as a
// client of `toollatch proxy` (tests/test_proxy_js.py).
//
// Usage: node tests/js/openai_compatible_client.mjs '<json>' with {"baseURL", "model", "tools":
// {name: JSON Schema}}. The tools have no execute: streamText reports each call the model made
// (its `tool-call` parts) and stops. Prints one JSON object: {"calls": [{"id", "name", "input",
// "invalid"}], "errors": [...], "finishReason"}.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { jsonSchema, streamText, tool } from "ai";

const config = JSON.parse(process.argv[2]);
const provider = createOpenAICompatible({ name: "toollatch", baseURL: config.baseURL, apiKey: "sk-js" });
const tools = Object.fromEntries(
  Object.entries(config.tools).map(([name, schema]) => [name, tool({ inputSchema: jsonSchema(schema) })]),
);
const result = streamText({ model: provider(config.model), prompt: "weather?", tools, maxRetries: 0 });
const calls = [];
const errors = [];
for await (const part of result.fullStream) {
  if (part.type === "tool-call") {
    calls.push({ id: part.toolCallId, name: part.toolName, input: part.input, invalid: Boolean(part.invalid) });
  } else if (part.type === "error" || part.type === "tool-error") {
    errors.push(String(part.error?.message ?? part.error));
  }
}
let finishReason = null;
try {
  finishReason = await result.finishReason;
} catch (error) {
  errors.push(String(error?.message ?? error));
}
console.log(JSON.stringify({ calls, errors, finishReason }));
