import type { Problem } from "./types.js";

/**
 * The service refused the request (any 4xx but 429): a caller's bug or a
 * wrong token. Always thrown, whatever `onError` says, because silently
 * allowing or denying would hide the bug.
 */
export class PglimitProblemError extends Error {
  override readonly name = "PglimitProblemError";
  /** `urn:pglimit:problem:<kind>`, e.g. `urn:pglimit:problem:invalid-field`. */
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail: string;
  /** The request field at fault, when there is one (e.g. `identifiers.ip`). */
  readonly field?: string;
  readonly requestId?: string;

  constructor(problem: Problem, requestId?: string) {
    super(`pglimit: ${problem.status} ${problem.title}: ${problem.detail}`);
    this.type = problem.type;
    this.title = problem.title;
    this.status = problem.status;
    this.detail = problem.detail;
    if (problem.field !== undefined) this.field = problem.field;
    if (requestId !== undefined) this.requestId = requestId;
  }
}

/** pglimit could not be reached or did not answer, with `onError: "throw"`. `cause` says why. */
export class PglimitUnavailableError extends Error {
  override readonly name = "PglimitUnavailableError";
  readonly reason: "timeout" | "error";

  constructor(reason: "timeout" | "error", cause: unknown) {
    super(`pglimit unavailable (${reason}): ${describe(cause)}`, { cause });
    this.reason = reason;
  }
}

/** Thrown into the fetch when `timeoutMs` passes, so the cause names it. */
export class PglimitTimeoutError extends Error {
  override readonly name = "PglimitTimeoutError";
  constructor(timeoutMs: number) {
    super(`no answer within ${timeoutMs} ms`);
  }
}

function describe(cause: unknown): string {
  return cause instanceof Error ? cause.message : String(cause);
}
