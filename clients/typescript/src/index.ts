export { Pglimit } from "./client.js";
export { PglimitProblemError, PglimitTimeoutError, PglimitUnavailableError } from "./errors.js";
export { rateLimitHeaders } from "./headers.js";
export type * from "./types.js";
