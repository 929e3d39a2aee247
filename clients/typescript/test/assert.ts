// A few assertions with no Node import, so test/cases.ts runs unchanged in
// workerd (node:assert would need the nodejs_compat flag there).
export function ok(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(`assertion failed: ${message}`);
}

export function equal<T>(actual: T, expected: T, message: string): void {
  if (!Object.is(actual, expected)) {
    throw new Error(`${message}: expected ${show(expected)}, got ${show(actual)}`);
  }
}

export function deepEqual(actual: unknown, expected: unknown, message: string): void {
  if (show(actual) !== show(expected)) {
    throw new Error(`${message}: expected ${show(expected)}, got ${show(actual)}`);
  }
}

/** Awaits `promise`, expecting it to reject; returns the rejection. */
export async function rejects(promise: Promise<unknown>, message: string): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error(`${message}: expected a rejection, got a result`);
}

function show(value: unknown): string {
  return JSON.stringify(value) ?? String(value);
}
