// The client's public types. Wire shapes come from src/generated/openapi.ts
// (generated from the service's openapi.json, checked in CI by
// `npm run check-types`), so a change to the API shows up here as a type
// error instead of a silent mismatch.
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** The JSON body of `POST /check`, as the service defines it. */
export type CheckRequest = Schemas["CheckRequest"];
/** `{ policy, identifiers, cost? }`: a named policy (e.g. `login`). */
export type PolicyCheckRequest = Extract<CheckRequest, { policy: string }>;
/** `{ key, limit, window, algorithm?, cost? }`: an ad hoc key. */
export type AdHocCheckRequest = Extract<CheckRequest, { key: string }>;
/** The JSON body of `POST /reset`: a check body plus `buckets?`. */
export type ResetRequest = Schemas["ResetRequest"];

// Omit over each member of a union, so a peek keeps both request forms.
type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;
/** A check body without `cost`: `peek` always sends `cost: 0`. */
export type PeekRequest = DistributiveOmit<CheckRequest, "cost">;

/** The answer body of `/check` and `/reset` (200 and 429). */
export type Decision = Schemas["Decision"];
/** An RFC 9457 problem document, as the service sends it. */
export type Problem = Schemas["Problem"];

type WireBucket = Decision["buckets"][number];
export type Algorithm = WireBucket["algorithm"];
export type Store = Decision["store"];
export type OverrideMatch = NonNullable<Decision["override"]>;

/** The lease an admitted check of a concurrency bucket holds: release it when done. */
export interface Lease {
  /** Pass to `release` or `renew`; random, it names nothing of the check. */
  id: string;
  /** When the slots free themselves unless released or renewed. */
  expiresAt: Date;
}

/** What `withLease` gives: `fn`'s value when admitted (the lease released after), else the denial. */
export type LeaseOutcome<T> =
  | { allowed: true; value: T; result: PglimitResult }
  | { allowed: false; result: PglimitResult };

/** One bucket of a check, e.g. `email_ip` of the `login` policy. */
export interface BucketResult {
  name: WireBucket["name"];
  algorithm: Algorithm;
  allowed: boolean;
  limit: number;
  remaining: number;
  /** When this bucket is back to its full limit. */
  resetAt: Date;
  /** Present (true) when this bucket's key is blocked. */
  blocked?: true;
}

/** The rate-limit headers of the service's answer, to forward on your own 429. */
export interface RateLimitHeaders {
  "RateLimit-Policy"?: string;
  RateLimit?: string;
  "Retry-After"?: string;
}

/**
 * - `checked`: pglimit answered (allowed or denied).
 * - `timeout`: no answer within `timeoutMs`; `onError` decided.
 * - `error`: network error, unreadable answer or 5xx; `onError` decided.
 */
export type Reason = "checked" | "timeout" | "error";

export interface PglimitResult {
  allowed: boolean;
  /** What the deciding bucket can still admit. */
  remaining: number;
  limit: number;
  resetAt: Date;
  /** Whole seconds until a check of the same cost could pass; 0 when allowed (and for a deny-listed check, which has no end). */
  retryAfter: number;
  buckets: BucketResult[];
  /** Postgres did not decide (memory fallback, or no answer at all). */
  degraded: boolean;
  store: Store;
  reason: Reason;
  shadow?: true;
  wouldAllow?: boolean;
  blockedBy?: string;
  override?: OverrideMatch;
  /** Admitted by a concurrency bucket in Postgres: the slots it holds (none when admitted from memory in an outage). */
  lease?: Lease;
  /** With `maxWait`: how long pglimit held the check, in ms (0: answered at once). */
  waitedMs?: number;
  /** The service's `x-request-id`, to find the request in its logs. */
  requestId?: string;
  headers: RateLimitHeaders;
  /** Why pglimit was not reached (reason `timeout` or `error` only), for your logs. */
  error?: unknown;
}

export type OnError = "allow" | "deny" | "throw";

export interface PglimitOptions {
  /** Base URL of the service, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  url: string;
  /** Sent as `Authorization: Bearer <token>` (the service's `PGLIMIT_API_TOKENS`). */
  token?: string | undefined;
  /**
   * Sent as `Authorization: Bearer <adminToken>` by the admin calls (`explain`)
   * in place of `token` (the service's `PGLIMIT_ADMIN_TOKENS`; API tokens do
   * not open them). Without it they send no token, which pglimit accepts only
   * on a loopback bind with no tokens configured.
   */
  adminToken?: string | undefined;
  /** Longest wait for an answer, body included. Default 1000. */
  timeoutMs?: number | undefined;
  /** What a timeout, network error or 5xx gives: admit (default), refuse, or throw `PglimitUnavailableError`. */
  onError?: OnError | undefined;
  /** A fetch to use instead of the global one (e.g. a Workers service binding's `fetch`). */
  fetch?: ((input: string, init: RequestInit) => Promise<Response>) | undefined;
}

type WireExplanation = Schemas["Explanation"];
type WireExplainedBucket = Schemas["ExplainedBucket"];
/** Which rule decides an explained check. */
export type ExplainReason = WireExplanation["reason"];
/** The override that applies: the policy file's (`index`) or the API's (`id`). */
export type ExplainedRule = Schemas["ExplainedRule"];

/** A bucket's stored state in its algorithm's terms, tagged with the algorithm. */
export type BucketState =
  | { algorithm: "fixed_window"; count: number; windowEndsAt: Date }
  | { algorithm: "sliding_window"; windowStartedAt: Date; count: number; previousWindowCount: number }
  | { algorithm: "sliding_log"; /** When each unit still counted was taken, oldest first. */ entries: Date[] }
  | { algorithm: "token_bucket"; theoreticalArrivalTime: Date }
  | { algorithm: "concurrency"; slotsHeld: number; earliestLeaseEnd: Date };

/** A block on a bucket's key: an operator's (`admin`) or a lockout (the bucket's `block_for`). */
export interface ExplainedBlock {
  kind: Schemas["ExplainedBlock"]["kind"];
  reason: string | null;
  until: Date;
  since: Date;
}

/** A key's denials in the top list (`GET /admin/top`), summed over every pglimit instance. */
export interface KeyDenials {
  /** Denials of the key since `since` (0: none). */
  count: number;
  /** When the last minute with a denial began; `null` when there was none. */
  last: Date | null;
  /** Counted from then: the explanation's `checkedAt` less the top list's retention (`PGLIMIT_TOP_RETENTION`, 7 days by default). */
  since: Date;
}

/** One bucket of an explained check, with its state and why it allows or denies. */
export interface ExplainedBucket {
  name: WireExplainedBucket["name"];
  /** The first 16 hex digits of the bucket's key (as `/admin/blocks` lists keys); never the identifiers. */
  key: string;
  algorithm: Algorithm;
  /** The limit enforced: an override's, and from memory this instance's share. */
  limit: number;
  /** The window (a concurrency bucket's lease), in seconds. */
  windowSeconds: number;
  /** What is stored; `null` when nothing stored counts: a full bucket. */
  state: BucketState | null;
  /** Whether this bucket alone has room for the cost now. */
  allowed: boolean;
  remaining: number;
  /** When this bucket is back to its full limit. */
  resetAt: Date;
  /** Whole seconds until a check of this cost passes this bucket (a block's end); 0 when it has room. */
  retryAfter: number;
  block: ExplainedBlock | null;
  /** Checks this pglimit instance holds waiting (`maxWait`) on this key. */
  waiters: number;
  /** How often the key was denied over the top list's retention; `null` when pglimit's top list is off or could not be read. */
  denials: KeyDenials | null;
  /** Why this bucket allows or denies, in a sentence. */
  why: string;
}

/** What `check` would answer now for the same request, and why; nothing was counted. */
export interface Explanation {
  /** The policy; `null` for an ad hoc key. */
  policy: string | null;
  cost: number;
  /** What `check` would answer now (`true` for a shadow policy: see `wouldAllow`). */
  allowed: boolean;
  reason: ExplainReason;
  /** The answer in a sentence or two, naming the bucket or rule that decides. */
  why: string;
  rule: ExplainedRule | null;
  shadow?: true;
  /** In shadow mode only: whether enforcing the policy would admit it. */
  wouldAllow?: boolean;
  /** `memory`: read from this instance's memory while Postgres is away. */
  store: WireExplanation["store"];
  degraded: boolean;
  /** The store's clock when it read the buckets. */
  checkedAt: Date;
  /** This instance repeats a remembered denial of this exact check until then, without asking Postgres. */
  rememberedDenialUntil?: Date;
  buckets: ExplainedBucket[];
  /** The service's `x-request-id`. */
  requestId?: string;
}

export interface CallOptions {
  /** Aborting it abandons the call and rejects with the signal's reason (never turned into an `onError` outcome). */
  signal?: AbortSignal;
}

export interface CheckOptions extends CallOptions {
  /**
   * Hold a check that would be denied up to this long, in milliseconds or as
   * the service writes it (`"2s"`): pglimit answers when it is admitted, or
   * with the denial once `maxWait` has passed. The call's `timeoutMs` is
   * extended by it.
   */
  maxWait?: number | string;
}
