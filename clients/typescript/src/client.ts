import {
  FALLBACK_RETRY_AFTER_S,
  parseDecision,
  parseExplanation,
  parseJson,
  parseProblem,
  storeUnavailable,
  toExplanation,
  toResult,
} from "./decode.js";
import { PglimitProblemError, PglimitTimeoutError, PglimitUnavailableError } from "./errors.js";
import type {
  CallOptions,
  CheckOptions,
  CheckRequest,
  Explanation,
  Lease,
  LeaseOutcome,
  OnError,
  PeekRequest,
  PglimitOptions,
  PglimitResult,
  RateLimitHeaders,
  ResetRequest,
} from "./types.js";

const DEFAULT_TIMEOUT_MS = 1000;
// The service's own fail-closed answer (a policy with on_store_error = "deny").
const STORE_UNAVAILABLE = "urn:pglimit:problem:store-unavailable";
// A lease that does not exist (any more): it holds nothing.
const UNKNOWN_LEASE = "urn:pglimit:problem:unknown-lease";

type Fetch = NonNullable<PglimitOptions["fetch"]>;

/** A pglimit client: one `fetch` per call, nothing kept between calls. */
export class Pglimit {
  readonly #checkUrl: string;
  readonly #resetUrl: string;
  readonly #releaseUrl: string;
  readonly #renewUrl: string;
  readonly #explainUrl: string;
  readonly #headers: Record<string, string>;
  readonly #adminHeaders: Record<string, string>;
  readonly #timeoutMs: number;
  readonly #onError: OnError;
  readonly #fetch: Fetch | undefined;

  constructor(options: PglimitOptions) {
    // A trailing slash keeps a path prefix: new URL("check", "http://h/p/").
    const base = options.url.endsWith("/") ? options.url : `${options.url}/`;
    this.#checkUrl = new URL("check", base).href;
    this.#resetUrl = new URL("reset", base).href;
    this.#releaseUrl = new URL("release", base).href;
    this.#renewUrl = new URL("renew", base).href;
    this.#explainUrl = new URL("admin/explain", base).href;
    this.#headers = { "content-type": "application/json", accept: "application/json" };
    // The admin calls send the admin token, never the API token (which does not open them).
    this.#adminHeaders = { ...this.#headers };
    if (options.token !== undefined) this.#headers["authorization"] = `Bearer ${options.token}`;
    if (options.adminToken !== undefined) this.#adminHeaders["authorization"] = `Bearer ${options.adminToken}`;
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(timeoutMs > 0)) throw new RangeError("timeoutMs must be a positive number");
    this.#timeoutMs = timeoutMs;
    const onError = options.onError ?? "allow";
    if (onError !== "allow" && onError !== "deny" && onError !== "throw") {
      throw new RangeError(`onError must be "allow", "deny" or "throw", not ${String(onError)}`);
    }
    this.#onError = onError;
    this.#fetch = options.fetch;
  }

  /**
   * Checks and, if allowed, consumes `cost` (default 1) from every bucket of
   * the check; with `maxWait`, pglimit may hold a denied check until admitted.
   */
  check(request: CheckRequest, options?: CheckOptions): Promise<PglimitResult> {
    const maxWait = options?.maxWait;
    if (maxWait === undefined) return this.#call(this.#checkUrl, request, options);
    const body = { ...request, max_wait: typeof maxWait === "number" ? `${Math.round(maxWait)}ms` : maxWait };
    return this.#call(this.#checkUrl, body, options, waitMs(body.max_wait));
  }

  /** Reports the state without consuming anything (a check of cost 0). */
  peek(request: PeekRequest, options?: CallOptions): Promise<PglimitResult> {
    return this.#call(this.#checkUrl, { ...request, cost: 0 }, options);
  }

  /** Puts the check's buckets (or only `buckets`) back to full, then answers like a peek. */
  reset(request: ResetRequest, options?: CallOptions): Promise<PglimitResult> {
    return this.#call(this.#resetUrl, request, options);
  }

  /**
   * Frees a lease's slots. True if it held any; false if it was released
   * already, has ended, or no longer exists. Throws `PglimitUnavailableError`
   * if pglimit cannot be reached (the lease then ends by itself).
   */
  async release(leaseId: string, options?: CallOptions): Promise<boolean> {
    try {
      const { answer } = await this.#post(this.#releaseUrl, { lease: leaseId }, options);
      return (answer as { released?: unknown } | undefined)?.released === true;
    } catch (error) {
      if (error instanceof PglimitProblemError && error.type === UNKNOWN_LEASE) return false;
      throw error;
    }
  }

  /** Extends a lease by its lease time from now. Throws `PglimitProblemError` (404) if it has ended or was released. */
  async renew(leaseId: string, options?: CallOptions): Promise<Lease> {
    const { answer } = await this.#post(this.#renewUrl, { lease: leaseId }, options);
    const lease = (answer as { lease?: { id?: unknown; expires_at?: unknown } } | undefined)?.lease;
    if (typeof lease?.id !== "string" || typeof lease.expires_at !== "string") {
      throw new Error("pglimit answered /renew with a body that is not a lease");
    }
    return { id: lease.id, expiresAt: new Date(lease.expires_at) };
  }

  /**
   * What `check(request)` would answer now, and why, counting nothing
   * (`POST /admin/explain`, an admin call: sent with `adminToken`). Every
   * answer is an explanation, allowed or not. Throws `PglimitProblemError` for
   * a 4xx (a wrong admin token: 401; a malformed request or unknown policy:
   * 400 naming the field) and `PglimitUnavailableError` when pglimit cannot be
   * reached, does not answer in `timeoutMs` or answers 5xx (`onError` plays no
   * part: there is no explanation to make up).
   */
  async explain(request: CheckRequest, options?: CallOptions): Promise<Explanation> {
    const { answer, requestId } = await this.#post(this.#explainUrl, request, options, this.#adminHeaders);
    const explanation = parseExplanation(answer);
    if (explanation === undefined) {
      throw new Error("pglimit answered /admin/explain with a body that is not an explanation");
    }
    return toExplanation(explanation, requestId);
  }

  /**
   * Checks `request`; if admitted, runs `fn` and releases the check's lease
   * in `finally`, whether `fn` returns or throws. A release pglimit cannot
   * take (unreachable) is left to end by itself rather than hide `fn`'s outcome.
   */
  async withLease<T>(
    request: CheckRequest,
    fn: (result: PglimitResult) => Promise<T> | T,
    options?: CheckOptions,
  ): Promise<LeaseOutcome<T>> {
    const result = await this.check(request, options);
    if (!result.allowed) return { allowed: false, result };
    try {
      return { allowed: true, value: await fn(result), result };
    } finally {
      if (result.lease !== undefined) {
        await this.release(result.lease.id).catch((error: unknown) => {
          if (!(error instanceof PglimitUnavailableError)) throw error;
        });
      }
    }
  }

  /**
   * POSTs `body` for the parsed 200 answer (`undefined` if it is not JSON).
   * A 4xx throws `PglimitProblemError`; no answer, a timeout or a 5xx throw
   * `PglimitUnavailableError`: there is no `onError` outcome for these calls.
   */
  async #post(
    url: string,
    body: object,
    options: CallOptions | undefined,
    headers = this.#headers,
  ): Promise<{ answer: unknown; requestId: string | undefined }> {
    const callerSignal = options?.signal;
    callerSignal?.throwIfAborted();
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new PglimitTimeoutError(this.#timeoutMs));
    }, this.#timeoutMs);
    const onCallerAbort = () => controller.abort(callerSignal?.reason);
    callerSignal?.addEventListener("abort", onCallerAbort, { once: true });
    try {
      const doFetch: Fetch = this.#fetch ?? fetch;
      const init = { method: "POST", headers, body: JSON.stringify(body), signal: controller.signal };
      const response = await doFetch(url, init);
      const text = await response.text();
      const requestId = response.headers.get("x-request-id") ?? undefined;
      if (response.status === 200) return { answer: parseJson(text), requestId };
      const problem = parseProblem(text, response);
      const error = new PglimitProblemError(problem, requestId);
      if (response.status >= 400 && response.status < 500) throw error;
      throw new PglimitUnavailableError("error", error);
    } catch (error) {
      if (error instanceof PglimitProblemError || error instanceof PglimitUnavailableError) throw error;
      if (callerSignal?.aborted && !timedOut) throw callerSignal.reason;
      throw new PglimitUnavailableError(timedOut ? "timeout" : "error", timedOut ? controller.signal.reason : error);
    } finally {
      clearTimeout(timer);
      callerSignal?.removeEventListener("abort", onCallerAbort);
    }
  }

  async #call(url: string, body: object, options: CallOptions | undefined, heldMs = 0): Promise<PglimitResult> {
    const callerSignal = options?.signal;
    callerSignal?.throwIfAborted();
    const controller = new AbortController();
    let timedOut = false;
    // A check pglimit may hold gets that much longer to answer.
    const timeoutMs = this.#timeoutMs + heldMs;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new PglimitTimeoutError(timeoutMs));
    }, timeoutMs);
    const onCallerAbort = () => controller.abort(callerSignal?.reason);
    callerSignal?.addEventListener("abort", onCallerAbort, { once: true });
    try {
      // Read at call time, not construction, so a fetch patched later (tests,
      // instrumentation) is used; called unbound, as Workers require.
      const doFetch: Fetch = this.#fetch ?? fetch;
      const response = await doFetch(url, {
        method: "POST",
        headers: this.#headers,
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      // The body is read under the same timer: a stalled body is a timeout too.
      const text = await response.text();
      return this.#interpret(response, text);
    } catch (error) {
      if (error instanceof PglimitProblemError) throw error;
      if (callerSignal?.aborted && !timedOut) throw callerSignal.reason;
      return this.#fallback(timedOut ? "timeout" : "error", timedOut ? controller.signal.reason : error);
    } finally {
      clearTimeout(timer);
      callerSignal?.removeEventListener("abort", onCallerAbort);
    }
  }

  #interpret(response: Response, text: string): PglimitResult {
    const requestId = response.headers.get("x-request-id") ?? undefined;
    const { status } = response;
    if (status === 200 || status === 429) {
      const decision = parseDecision(text);
      if (decision === undefined) {
        throw new Error(`pglimit answered ${status} with a body that is not a decision`);
      }
      return toResult(decision, response.headers, requestId);
    }
    const problem = parseProblem(text, response);
    if (status >= 400 && status < 500) throw new PglimitProblemError(problem, requestId);
    if (status === 503 && problem.type === STORE_UNAVAILABLE) {
      // Not an outage of pglimit but its answer: the policy fails closed while
      // Postgres is away. Letting onError "allow" turn it into an admission
      // would undo the policy, so it is a denial whatever onError says.
      return storeUnavailable(response.headers, requestId);
    }
    // 5xx (and anything unexpected): pglimit could not decide.
    throw new PglimitUnavailableError("error", new PglimitProblemError(problem, requestId));
  }

  #fallback(reason: "timeout" | "error", cause: unknown): PglimitResult {
    // Unwrap the error thrown by #interpret for a 5xx, so `cause` is the problem.
    const error = cause instanceof PglimitUnavailableError ? cause.cause : cause;
    if (this.#onError === "throw") throw new PglimitUnavailableError(reason, error);
    const allowed = this.#onError === "allow";
    const headers: RateLimitHeaders = allowed ? {} : { "Retry-After": String(FALLBACK_RETRY_AFTER_S) };
    return {
      allowed,
      remaining: 0,
      limit: 0,
      resetAt: new Date(),
      retryAfter: allowed ? 0 : FALLBACK_RETRY_AFTER_S,
      buckets: [],
      degraded: true,
      store: "none",
      reason,
      headers,
      error,
    };
  }
}

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Milliseconds in a `max_wait` as the service writes it; 0 for text it would refuse (a 400, at once). */
function waitMs(text: string): number {
  const match = /^([0-9]+)(ms|s|m|h|d)$/.exec(text);
  return match ? Number(match[1]) * (UNIT_MS[match[2] ?? ""] ?? 0) : 0;
}
