// The OpenAI Node SDK (`openai` on npm) against the gateway: Chat Completions for every group.
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";

import { API_KEY, BASE_URL, PNG, WEATHER_PROMPT, Weather, run, weather } from "./harness.mjs";

const client = new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0 });

const TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

function usage(u) {
  return u ? { input: u.prompt_tokens, output: u.completion_tokens, total: u.total_tokens } : null;
}

await run({ "openai-node": {
  async chat(model) {
    const out = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hello" }] });
    const choice = out.choices[0];
    return { text: choice.message.content, finish: choice.finish_reason, usage: usage(out.usage), model: out.model };
  },

  async stream(model) {
    const stream = await client.chat.completions.create({
      model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: "Tell me a story" }],
    });
    let text = "", finishes = [], last = null;
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        text += choice.delta.content ?? "";
        if (choice.finish_reason) finishes.push(choice.finish_reason);
      }
      last = chunk;
    }
    // exactly one finish chunk, and usage only on the last chunk (choices: [])
    return { text, finish: finishes.join(","), usage: last.choices.length ? null : usage(last.usage) };
  },

  async tools(model) {
    const messages = [{ role: "user", content: WEATHER_PROMPT }];
    const first = await client.chat.completions.create({ model, messages, tools: TOOLS });
    const message = first.choices[0].message;
    messages.push(message);
    const calls = [];
    for (const call of message.tool_calls ?? []) {
      if (call.type !== "function") continue;  // as client code does: only function calls are run
      const input = JSON.parse(call.function.arguments);
      calls.push({ name: call.function.name, input });
      messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(weather(input.city)) });
    }
    const second = await client.chat.completions.create({ model, messages, tools: TOOLS });
    return { steps: 2, first_finish: first.choices[0].finish_reason, calls,
             text: second.choices[0].message.content, finish: second.choices[0].finish_reason };
  },

  async structured(model) {
    const out = await client.chat.completions.parse({
      model, messages: [{ role: "user", content: "The weather in Seoul" }],
      response_format: zodResponseFormat(Weather, "weather"),
    });
    return { object: out.choices[0].message.parsed };
  },

  async image(model) {
    const out = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: [
        { type: "text", text: "What is in this image?" },
        { type: "image_url", image_url: { url: PNG } },
      ] }],
    });
    return { text: out.choices[0].message.content, usage: usage(out.usage) };
  },
} });
