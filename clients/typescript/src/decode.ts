// The service's answers, read into results: a decision, its headers, a
// problem document, or the fallback's answer when the store is unavailable.
import type { components } from "./generated/openapi.js";
import type {
  BucketState,
  Decision,
  ExplainedBucket,
  Explanation,
  PglimitResult,
  Problem,
  RateLimitHeaders,
} from "./types.js";

type Schemas = components["schemas"];
type WireExplanation = Schemas["Explanation"];
type WireExplainedBucket = Schemas["ExplainedBucket"];
type WireState = Schemas["BucketState"];

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

/** The answer of `POST /admin/explain`, its times as Dates and its names in camelCase. */
export function toExplanation(e: WireExplanation, requestId: string | undefined): Explanation {
  const explanation: Explanation = {
    policy: e.policy,
    cost: e.cost,
    allowed: e.allowed,
    reason: e.reason,
    why: e.why,
    rule: e.rule,
    store: e.store,
    degraded: e.degraded,
    checkedAt: new Date(e.checked_at),
    buckets: e.buckets.map(toExplainedBucket),
  };
  if (e.shadow !== undefined) explanation.shadow = e.shadow;
  if (e.would_allow !== undefined) explanation.wouldAllow = e.would_allow;
  if (e.remembered_denial_until !== undefined) explanation.rememberedDenialUntil = new Date(e.remembered_denial_until);
  if (requestId !== undefined) explanation.requestId = requestId;
  return explanation;
}

function toExplainedBucket(b: WireExplainedBucket): ExplainedBucket {
  return {
    name: b.name,
    key: b.key,
    algorithm: b.algorithm,
    limit: b.limit,
    windowSeconds: b.window_s,
    state: b.state === null ? null : toState(b.algorithm, b.state),
    allowed: b.allowed,
    remaining: b.remaining,
    resetAt: new Date(b.reset_at),
    retryAfter: b.retry_after_s ?? 0,
    block:
      b.block === null
        ? null
        : { kind: b.block.kind, reason: b.block.reason, until: new Date(b.block.until), since: new Date(b.block.since) },
    waiters: b.waiters,
    // Absent from a pglimit older than the top list: as if it were off.
    denials:
      b.denials == null
        ? null
        : {
            count: b.denials.count,
            last: b.denials.last === null ? null : new Date(b.denials.last),
            since: new Date(b.denials.since),
          },
    why: b.why,
  };
}

// The wire form of each algorithm's state, by the field only it has.
type StateOf<K extends string> = Extract<WireState, Record<K, unknown>>;

/** A state tagged with its bucket's algorithm (the wire form is untagged). */
function toState(algorithm: WireExplainedBucket["algorithm"], s: WireState): BucketState {
  switch (algorithm) {
    case "fixed_window": {
      const w = s as StateOf<"window_ends_at">;
      return { algorithm, count: w.count, windowEndsAt: new Date(w.window_ends_at) };
    }
    case "sliding_window": {
      const w = s as StateOf<"window_started_at">;
      return {
        algorithm,
        windowStartedAt: new Date(w.window_started_at),
        count: w.count,
        previousWindowCount: w.previous_window_count,
      };
    }
    case "sliding_log":
      return { algorithm, entries: (s as StateOf<"entries">).entries.map((t) => new Date(t)) };
    case "token_bucket":
      return { algorithm, theoreticalArrivalTime: new Date((s as StateOf<"theoretical_arrival_time">).theoretical_arrival_time) };
    case "concurrency": {
      const w = s as StateOf<"slots_held">;
      return { algorithm, slotsHeld: w.slots_held, earliestLeaseEnd: new Date(w.earliest_lease_end) };
    }
  }
}

export function parseExplanation(v: unknown): WireExplanation | undefined {
  const e = v as Partial<WireExplanation> | undefined;
  // Enough to know it is an explanation; the service's schema promises the rest.
  const ok =
    typeof e === "object" && e !== null && typeof e.allowed === "boolean" && typeof e.reason === "string" &&
    typeof e.checked_at === "string" && Array.isArray(e.buckets);
  return ok ? (e as WireExplanation) : undefined;
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
