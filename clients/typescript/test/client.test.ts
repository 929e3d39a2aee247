// The shared cases (cases.ts) on Node, against the real pglimit.
import { test } from "node:test";
import { cases, newId, type CaseEnv } from "./cases.js";
import { closedUrl, hangingServer, sharedPglimit } from "./support.js";

const env: Omit<CaseEnv, "id"> = {
  url: await sharedPglimit(),
  hangUrl: await hangingServer(),
  closedUrl: await closedUrl(),
};

for (const [name, run] of Object.entries(cases)) {
  test(name, () => run({ ...env, id: newId() }));
}
