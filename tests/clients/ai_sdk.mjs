// The Vercel AI SDK (`ai`) against the gateway through three providers: @ai-sdk/openai in chat mode
// (`.chat(model)`), @ai-sdk/openai in its default Responses mode (`provider(model)`, /v1/responses),
// and @ai-sdk/openai-compatible (`.chatModel(model)`), each with the settings a new user would write.
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

import { API_KEY, BASE_URL, PNG, WEATHER_PROMPT, Weather, run, weather } from "./harness.mjs";

const openai = createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY });
const compatible = createOpenAICompatible({
  name: "router", baseURL: BASE_URL, apiKey: API_KEY, includeUsage: true, supportsStructuredOutputs: true,
});

const TOOLS = {
  get_weather: tool({
    description: "The current weather in a city",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => weather(city),
  }),
};

const png = Buffer.from(PNG.split(",")[1], "base64");

function usage(u) {
  return { input: u.inputTokens ?? null, output: u.outputTokens ?? null, total: u.totalTokens ?? null };
}

function cells(provider, { tools = true } = {}) {
  const out = {
    async chat(model) {
      const r = await generateText({ model: provider(model), prompt: "Hello", maxRetries: 0 });
      return { text: r.text, finish: r.finishReason, usage: usage(r.usage), model: r.response.modelId };
    },

    async stream(model) {
      const r = streamText({ model: provider(model), prompt: "Tell me a story", maxRetries: 0 });
      let text = "";
      for await (const part of r.fullStream) {
        if (part.type === "error") throw part.error;
        if (part.type === "text-delta") text += part.text;
      }
      return { text, finish: await r.finishReason, usage: usage(await r.usage) };
    },

    // two turns: the second sends the first's answer back (the Responses provider by id: item_reference)
    async conversation(model) {
      const prompt = { role: "user", content: "My name is Ada. Remember it." };
      const first = await generateText({ model: provider(model), messages: [prompt], maxRetries: 0 });
      const second = await generateText({
        model: provider(model), maxRetries: 0,
        messages: [prompt, ...first.response.messages, { role: "user", content: "What is my name?" }],
      });
      return {
        text: second.text, finish: second.finishReason, usage: usage(second.usage), first_usage: usage(first.usage),
        first_id: first.response.id, second_id: second.response.id,
      };
    },

    async tools(model) {
      const r = await generateText({
        model: provider(model), tools: TOOLS, stopWhen: stepCountIs(3), prompt: WEATHER_PROMPT, maxRetries: 0,
      });
      return {
        steps: r.steps.length,
        first_finish: r.steps[0].finishReason,
        calls: r.steps[0].toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
        text: r.text,
        finish: r.finishReason,
      };
    },

    async structured(model) {
      const r = await generateObject({
        model: provider(model), schema: Weather, prompt: "The weather in Seoul", maxRetries: 0,
      });
      return { object: r.object };
    },

    async image(model) {
      const r = await generateText({
        model: provider(model), maxRetries: 0,
        messages: [{ role: "user", content: [
          { type: "text", text: "What is in this image?" },
          { type: "image", image: png, mediaType: "image/png" },
        ] }],
      });
      return { text: r.text, usage: usage(r.usage) };
    },
  };
  if (!tools) delete out.tools;
  return out;
}

await run({
  "ai-sdk-openai-chat": cells((m) => openai.chat(m)),
  // later turns and tool steps refer to earlier output by id (item_reference), resolved from the gateway's store
  "ai-sdk-openai-responses": cells((m) => openai(m)),
  "ai-sdk-openai-compatible": cells((m) => compatible.chatModel(m)),
});
