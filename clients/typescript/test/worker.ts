// A Worker that runs one case of cases.ts inside workerd and answers
// {ok} or {ok: false, error}. Bundled with the built client by workerd.test.ts.
import { cases, type CaseEnv, type CaseName } from "./cases.js";

interface Env {
  PGLIMIT_URL: string;
  HANG_URL: string;
  CLOSED_URL: string;
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const params = new URL(request.url).searchParams;
    const name = params.get("case") as CaseName;
    const id = params.get("id") ?? "";
    const run = cases[name];
    if (!run) return Response.json({ ok: false, error: `no case ${name}` }, { status: 404 });
    const caseEnv: CaseEnv = { url: env.PGLIMIT_URL, hangUrl: env.HANG_URL, closedUrl: env.CLOSED_URL, id };
    try {
      await run(caseEnv);
      return Response.json({ ok: true, runtime: navigator.userAgent });
    } catch (error) {
      return Response.json({ ok: false, error: error instanceof Error ? `${error.stack ?? error.message}` : String(error) });
    }
  },
};
