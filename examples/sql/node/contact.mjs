// A contact form's handler with node-postgres: the message is stored and
// the recipient's limit taken in one transaction, so that a refused
// message leaves no row and a stored one is always counted.
//
//   DATABASE_URL=postgres://contact_app@host/app node contact.mjs RECIPIENT SENDER BODY [TIMES]
//
// Prints one line per attempt: "sent ID" or "refused, retry after N s".
import { pathToFileURL } from "node:url";
import pg from "pg";

/**
 * Stores one message unless the contact policy refuses its recipient.
 * @returns {Promise<{sent: true, id: string} | {sent: false, retryAfterS: number}>}
 */
export async function sendContactMessage(pool, { recipient, sender, body }) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const { rows } = await client.query(
      "INSERT INTO contact_messages (recipient, sender, body) VALUES ($1, $2, $3) RETURNING id",
      [recipient, sender, body],
    );
    // The check comes last and waits at most 2 s for the recipient's row,
    // which it keeps locked until COMMIT.
    await client.query("SET LOCAL lock_timeout = '2s'");
    await client.query("SELECT * FROM pglimit.enforce('contact', jsonb_build_object('recipient', $1::text))", [
      recipient,
    ]);
    await client.query("COMMIT");
    return { sent: true, id: rows[0].id };
  } catch (err) {
    await client.query("ROLLBACK");
    if (err.code === "RL429") {
      // DETAIL is JSON: retry_after_s, reset_at, limit, remaining, buckets.
      return { sent: false, retryAfterS: JSON.parse(err.detail).retry_after_s };
    }
    throw err;
  } finally {
    client.release();
  }
}

async function main() {
  const [recipient, sender, body, times = "1"] = process.argv.slice(2);
  if (!process.env.DATABASE_URL || body === undefined) {
    console.error("usage: DATABASE_URL=postgres://... node contact.mjs RECIPIENT SENDER BODY [TIMES]");
    process.exit(2);
  }
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
  try {
    for (let i = 0; i < Number(times); i++) {
      const result = await sendContactMessage(pool, { recipient, sender, body });
      console.log(result.sent ? `sent ${result.id}` : `refused, retry after ${result.retryAfterS} s`);
    }
  } finally {
    await pool.end();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main();
}
