// Node-side helpers: the real pglimit, a server that never answers, a port
// nothing listens on. Each registers its own cleanup with after(), so call
// them at a test file's top level (an after() inside a before() hook would
// run as soon as that hook ends).
import { after } from "node:test";
import { createServer, type Server, type Socket } from "node:net";
import { startPglimit } from "#pglimit-process";

/**
 * The pglimit of this test file: the one `npm test` started for every file
 * (PGLIMIT_URL), else one started here and stopped after the file.
 */
export async function sharedPglimit(): Promise<string> {
  if (process.env.PGLIMIT_URL) return process.env.PGLIMIT_URL;
  const pglimit = await startPglimit();
  after(() => pglimit.stop());
  return pglimit.url;
}

/** A TCP server that accepts connections and never answers; closed after the file. */
export async function hangingServer(): Promise<string> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {}); // the client aborting resets the connection
  });
  await listen(server);
  after(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise((done) => server.close(done));
  });
  return `http://127.0.0.1:${port(server)}`;
}

/** A loopback URL whose port was just bound and released: connections are refused. */
export async function closedUrl(): Promise<string> {
  const server = createServer();
  await listen(server);
  const url = `http://127.0.0.1:${port(server)}`;
  await new Promise((done) => server.close(done));
  return url;
}

function listen(server: Server): Promise<void> {
  return new Promise((done, fail) => {
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => done());
  });
}

function port(server: Server): number {
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("not a TCP server");
  return address.port;
}
