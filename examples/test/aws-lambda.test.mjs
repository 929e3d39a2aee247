// @ts-check
// Calls the Lambda handler with the sample API Gateway v2 event.
import { test } from "node:test";
import { readFile } from "node:fs/promises";
import { expectFiveThen429, freshEmail, pglimitUrl } from "./logins.mjs";

process.env.PGLIMIT_URL = pglimitUrl("aws-lambda"); // read when the handler module loads
const { handler } = await import("../aws-lambda/dist/handler.js");
const sample = JSON.parse(await readFile(new URL("../aws-lambda/event.json", import.meta.url), "utf8"));

test("aws-lambda: five logins, then 429 with the forwarded headers", async () => {
  const event = { ...sample, body: JSON.stringify({ email: freshEmail(), password: "x" }) };
  await expectFiveThen429(async () => {
    const res = await handler(structuredClone(event));
    const headers = Object.fromEntries(Object.entries(res.headers ?? {}).map(([k, v]) => [k.toLowerCase(), String(v)]));
    return { status: res.statusCode, headers, body: JSON.parse(res.body) };
  });
});

test("aws-lambda: a base64 body is read too", async () => {
  const body = Buffer.from(JSON.stringify({ email: freshEmail(), password: "x" })).toString("base64");
  const res = await handler({ ...structuredClone(sample), body, isBase64Encoded: true });
  if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}: ${res.body}`);
});
