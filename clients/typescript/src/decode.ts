// The service's answers, read into results: a decision, its headers, a
// problem document, or the fallback's answer when the store is unavailable.
import type { Decision, PglimitResult, Problem, RateLimitHeaders } from "./types.js";

// Answered on a "deny" fallback: soon enough to notice pglimit is back.
export const FALLBACK_RETRY_AFTER_S = 1;

export function toResult(d: Decision, h: Headers, requestId: string | undefined): PglimitResult {
  const result: PglimitResult = {
    allowed: d.allowed,
    remaining: d.remaining,
    limit: d.limit,
    resetAt: new Date(d.reset_at),
    retryAfter: d.retry_after_s ?? 0,
    buckets: d.buckets.map((b) => ({
      name: b.name,
      algorithm: b.algorithm,
      allowed: b.allowed,
      limit: b.limit,
      remaining: b.remaining,
      resetAt: new Date(b.reset_at),
      ...(b.blocked ? { blocked: true as const } : {}),
    })),
    degraded: d.degraded,
    store: d.store,
    reason: "checked",
    headers: rateLimitHeadersOf(h),
  };
  // Optional fields are left out rather than set to undefined, so results
  // compare and serialise cleanly.
  if (d.shadow !== undefined) result.shadow = d.shadow;
  if (d.would_allow !== undefined) result.wouldAllow = d.would_allow;
  if (d.blocked_by !== undefined) result.blockedBy = d.blocked_by;
  if (d.override !== undefined) result.override = d.override;
  if (d.lease !== undefined) result.lease = { id: d.lease.id, expiresAt: new Date(d.lease.expires_at) };
  if (d.waited_ms !== undefined) result.waitedMs = d.waited_ms;
  if (requestId !== undefined) result.requestId = requestId;
  return result;
}

export function storeUnavailable(h: Headers, requestId: string | undefined): PglimitResult {
  const retryAfter = Number(h.get("retry-after")) || FALLBACK_RETRY_AFTER_S;
  const result: PglimitResult = {
    allowed: false,
    remaining: 0,
    limit: 0,
    resetAt: new Date(Date.now() + retryAfter * 1000),
    retryAfter,
    buckets: [],
    degraded: true,
    store: "none",
    reason: "checked",
    headers: { "Retry-After": String(retryAfter) },
  };
  if (requestId !== undefined) result.requestId = requestId;
  return result;
}

function rateLimitHeadersOf(h: Headers): RateLimitHeaders {
  const out: RateLimitHeaders = {};
  const policy = h.get("ratelimit-policy");
  const limit = h.get("ratelimit");
  const retryAfter = h.get("retry-after");
  if (policy !== null) out["RateLimit-Policy"] = policy;
  if (limit !== null) out.RateLimit = limit;
  if (retryAfter !== null) out["Retry-After"] = retryAfter;
  return out;
}

export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

export function parseDecision(text: string): Decision | undefined {
  const v = parseJson(text) as Partial<Decision> | undefined;
  // Enough to know it is a decision; the service's schema promises the rest.
  const ok =
    typeof v === "object" && v !== null && typeof v.allowed === "boolean" &&
    typeof v.reset_at === "string" && Array.isArray(v.buckets);
  return ok ? (v as Decision) : undefined;
}

export function parseProblem(text: string, response: Response): Problem {
  const v = parseJson(text) as Partial<Problem> | undefined;
  if (typeof v === "object" && v !== null && typeof v.type === "string" && typeof v.status === "number") {
    return {
      type: v.type,
      title: v.title ?? response.statusText,
      status: v.status,
      detail: v.detail ?? "",
      ...(typeof v.field === "string" ? { field: v.field } : {}),
    };
  }
  // Not a problem document (e.g. a proxy's error page): describe what came.
  return { type: "about:blank", title: response.statusText, status: response.status, detail: text.slice(0, 200) };
}
