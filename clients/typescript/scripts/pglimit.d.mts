// Types of scripts/pglimit.mjs, for the TypeScript tests and bench.
export interface RunningPglimit {
  /** e.g. http://127.0.0.1:43817 */
  url: string;
  pid: number;
  /** SIGTERM, wait for the exit (the service stops its cluster), remove the data dir. */
  stop(): Promise<void>;
  exited: Promise<number | null>;
}
export function pglimitBin(): string;
export function startPglimit(options?: { env?: Record<string, string> }): Promise<RunningPglimit>;
