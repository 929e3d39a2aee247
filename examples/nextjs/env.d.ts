// Next.js provides process.env on both runtimes; declared here because the
// example is type-checked without Next's or Node's types.
declare const process: { env: Record<string, string | undefined> };
