// The AI SDK's own relay, for bench_relay.py --vs-ai-sdk: node's `http` module serving
// POST /api/chat as the AI SDK documents it (`streamText(...).pipeUIMessageStreamToResponse`),
// with `@ai-sdk/openai-compatible` pointed at the scripted model server and the scripted
// demo's tools (get_weather, write_file, add; the same JSON Schemas and results as
// toollatch's example tools in src/toollatch/tools/_examples.py; write_file writes the file,
// under a temporary folder). Pinned by the repository's package.json (ai 6.0.326,
// @ai-sdk/openai-compatible 2.0.92). Prints its URL (http://127.0.0.1:PORT) when listening.
//
//   node benchmarks/ai_sdk_relay.mjs MODEL_BASE_URL [MODEL]
import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { convertToModelMessages, jsonSchema, stepCountIs, streamText, tool } from "ai";

const [baseURL, modelName = "scripted"] = process.argv.slice(2);
const provider = createOpenAICompatible({ name: "scripted", baseURL, apiKey: "sk-bench" });
const workspace = await mkdtemp(join(tmpdir(), "ai-sdk-relay-"));
const CONDITIONS = ["sunny", "cloudy", "rain", "snow", "fog", "wind"];

const tools = {
  get_weather: tool({
    description: "Current weather for a city (demo data: made up from the city's name).",
    inputSchema: jsonSchema({
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["c", "f"] } },
      required: ["city"],
      additionalProperties: false,
    }),
    execute: async ({ city, unit = "c" }) => {
      const digest = createHash("sha256").update(city.trim().toLowerCase()).digest();
      const celsius = (digest[0] % 40) - 5;
      const temperature = unit === "c" ? celsius : Math.round((celsius * 9) / 5 + 32);
      return { city, unit, temperature, conditions: CONDITIONS[digest[1] % CONDITIONS.length] };
    },
  }),
  write_file: tool({
    description: "Write a UTF-8 text file in the workspace, replacing it if it exists.",
    inputSchema: jsonSchema({
      type: "object",
      properties: { path: { type: "string" }, content: { type: "string" } },
      required: ["path", "content"],
      additionalProperties: false,
    }),
    execute: async ({ path, content }) => {
      const parts = path.split("/").filter((p) => p && p !== "." && p !== "..");
      const file = join(workspace, randomBytes(6).toString("hex"), ...parts);
      await mkdir(dirname(file), { recursive: true });
      const data = Buffer.from(content, "utf8");
      await writeFile(file, data);
      return { path: parts.join("/"), bytes: data.length };
    },
  }),
  add: tool({
    description: "Add two numbers.",
    inputSchema: jsonSchema({
      type: "object",
      properties: { a: { type: "number" }, b: { type: "number" } },
      required: ["a", "b"],
      additionalProperties: false,
    }),
    execute: async ({ a, b }) => a + b,
  }),
};

function readBody(request) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    request.on("error", reject);
  });
}

const server = createServer(async (request, response) => {
  if (request.method !== "POST" || request.url !== "/api/chat") {
    response.writeHead(404).end();
    return;
  }
  try {
    const { messages } = JSON.parse(await readBody(request));
    const result = streamText({
      model: provider(modelName),
      messages: await convertToModelMessages(messages),
      tools,
      stopWhen: stepCountIs(8), // (toollatch's relay.max_rounds)
      maxRetries: 0,
    });
    result.pipeUIMessageStreamToResponse(response);
  } catch (error) {
    response.writeHead(400, { "content-type": "text/plain" }).end(String(error));
  }
});
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`http://127.0.0.1:${server.address().port}\n`);
});
