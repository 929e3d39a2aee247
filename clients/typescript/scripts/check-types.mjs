// @ts-check
// Fails when src/generated/openapi.ts is not what openapi-typescript makes of
// ../../openapi.json today: regenerates into a temporary file with the same
// options as `npm run generate-types` and compares. Fix: npm run generate-types.
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const packageDir = fileURLToPath(new URL("..", import.meta.url));
const committed = join(packageDir, "src/generated/openapi.ts");
const dir = await mkdtemp(join(tmpdir(), "pglimit-types-"));
try {
  const fresh = join(dir, "openapi.ts");
  const pkg = JSON.parse(await readFile(join(packageDir, "package.json"), "utf8"));
  // The same command line as the generate-types script, output redirected.
  const args = pkg.scripts["generate-types"].split(" ").slice(1);
  args[args.indexOf("-o") + 1] = fresh;
  execFileSync(join(packageDir, "node_modules/.bin/openapi-typescript"), args, { cwd: packageDir, stdio: ["ignore", "ignore", "inherit"] });
  const [want, have] = await Promise.all([readFile(fresh, "utf8"), readFile(committed, "utf8")]);
  if (want !== have) {
    console.error("src/generated/openapi.ts differs from what openapi.json generates: run `npm run generate-types` and commit it");
    const a = have.split("\n"), b = want.split("\n");
    const line = a.findIndex((text, i) => text !== b[i]);
    console.error(`first difference at line ${line + 1}:\n- ${a[line]}\n+ ${b[line]}`);
    process.exitCode = 1;
  } else {
    console.log("src/generated/openapi.ts is up to date with openapi.json");
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
