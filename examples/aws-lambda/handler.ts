// An AWS Lambda handler behind API Gateway (HTTP API, payload format 2.0):
// POST /login limited by pglimit's `login` policy.
import type { APIGatewayProxyEventV2, APIGatewayProxyStructuredResultV2 } from "aws-lambda";
import { Pglimit, rateLimitHeaders } from "@pglimit/client";

// Created once per Lambda instance, outside the handler, and reused by every
// invocation it serves.
const pglimit = new Pglimit({
  url: process.env.PGLIMIT_URL ?? "http://127.0.0.1:8080",
  ...(process.env.PGLIMIT_TOKEN ? { token: process.env.PGLIMIT_TOKEN } : {}),
  timeoutMs: 1000,
  onError: "allow",
});

export async function handler(event: APIGatewayProxyEventV2): Promise<APIGatewayProxyStructuredResultV2> {
  const raw = event.isBase64Encoded ? Buffer.from(event.body ?? "", "base64").toString("utf8") : (event.body ?? "");
  let email: unknown;
  try {
    email = (JSON.parse(raw) as { email?: unknown }).email;
  } catch {
    return json(400, { error: "body is not JSON" });
  }
  if (typeof email !== "string") return json(400, { error: "email is required" });
  // API Gateway's view of the caller: not a header the caller can forge.
  const ip = event.requestContext.http.sourceIp;

  const limit = await pglimit.check({ policy: "login", identifiers: { email, ip } });
  if (!limit.allowed) {
    return json(429, { error: "too many attempts", retryAfter: limit.retryAfter }, rateLimitHeaders(limit));
  }
  // Verify the password here; after a success:
  //   await pglimit.reset({ policy: "login", identifiers: { email, ip }, buckets: ["email_ip"] });
  return json(200, { ok: true, remaining: limit.remaining }, rateLimitHeaders(limit));
}

function json(statusCode: number, body: unknown, headers: Record<string, string> = {}): APIGatewayProxyStructuredResultV2 {
  return { statusCode, headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) };
}
