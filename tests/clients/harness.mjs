import { writeFileSync } from "node:fs";

import { z } from "zod";

// Shared by the client scripts: the run's settings from the environment, the cells' common inputs,
// and one JSON report written to $ROUTER_REPORT (stdout is left to the clients: the AI SDK logs there),
// {"<client>/<group>/<feature>": {"ok": true, "data": ...} | {"ok": false, "error": ...}}.
// tests/test_client_matrix.py starts each script once against a real gateway and asserts every cell.

export const BASE_URL = process.env.ROUTER_BASE_URL;
export const API_KEY = process.env.ROUTER_API_KEY;
// {"openai": "openai/gpt-4o-mini", ...}: the model each provider group is tried with
export const MODELS = JSON.parse(process.env.ROUTER_MODELS);

export const PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
export const WEATHER_PROMPT = "What is the weather in Seoul? [tool]";

// the structured-output schema: required fields of each type, an enum, an array of nested objects
export const Weather = z.object({
  city: z.string(),
  temperature_c: z.number(),
  conditions: z.enum(["sunny", "cloudy", "rain"]),
  forecast: z.array(z.object({ day: z.string(), high_c: z.number() })),
});

// what the tool answers: the second step must see it come back
export function weather(city) {
  return { city, temperature_c: 21, conditions: "sunny" };
}

function failure(error) {
  return {
    ok: false,
    error: String(error?.message ?? error).slice(0, 2000),
    name: error?.constructor?.name ?? null,
    status: error?.status ?? error?.statusCode ?? null,
    body: error?.error ?? error?.responseBody ?? null,
  };
}

// cells that cannot work yet ("issue 18" in the README's matrix), not run
const WAITING = new Set(JSON.parse(process.env.ROUTER_WAITING ?? "[]"));

// clients: {"<client>": {"<feature>": async (model) => data}}; every client × group × feature runs,
// one call at a time
export async function run(clients) {
  const report = {};
  for (const [client, cells] of Object.entries(clients)) {
    for (const [group, model] of Object.entries(MODELS)) {
      for (const [feature, cell] of Object.entries(cells)) {
        const name = `${client}/${group}/${feature}`;
        if (WAITING.has(name)) continue;
        try {
          report[name] = { ok: true, data: await cell(model) };
        } catch (error) {
          report[name] = failure(error);
        }
      }
    }
  }
  writeFileSync(process.env.ROUTER_REPORT, JSON.stringify(report));
}
