//! The variables of the database: where counters are kept, with which
//! secret, and how pglimit reaches and uses it.

use crate::config::postgres::SchemaName;
use crate::config::setting::{OneOf, Range, Setting, Text, Unset::*, BOOLEAN};
use crate::storage::{Citus, CitusChecks, Pooler};

pub static DATABASE_URL: Setting<Text> = Setting {
    var: "DATABASE_URL",
    flag: "database-url",
    values: Text,
    unset: Means("a private cluster in PGLIMIT_DATA_DIR"),
    help: "PostgreSQL to keep counters in, password included; required by migrate.",
    secret: true,
};

pub static DATABASE_URL_FILE: Setting<Text> = Setting {
    var: "DATABASE_URL_FILE",
    flag: "database-url-file",
    values: Text,
    unset: Means("none"),
    help: "A file holding DATABASE_URL (a container secret), its trailing newline dropped; not with \
           DATABASE_URL.",
    secret: false,
};

pub static KEY_SECRET: Setting<Text> = Setting {
    var: "PGLIMIT_KEY_SECRET",
    flag: "key-secret",
    values: Text,
    unset: Means("required with DATABASE_URL; without, generated once in PGLIMIT_DATA_DIR"),
    help: "HMAC key for stored keys, at least 32 bytes, the same on every instance.",
    secret: true,
};

pub static KEY_SECRET_FILE: Setting<Text> = Setting {
    var: "PGLIMIT_KEY_SECRET_FILE",
    flag: "key-secret-file",
    values: Text,
    unset: Means("none"),
    help: "A file holding the key secret (a container secret), its trailing newline dropped; not with \
           PGLIMIT_KEY_SECRET.",
    secret: false,
};

pub static DATA_DIR: Setting<Text> = Setting {
    var: "PGLIMIT_DATA_DIR",
    flag: "data-dir",
    values: Text,
    unset: Is(".pglimit"),
    help: "Zero-config only: where the private cluster and its generated key secret live.",
    secret: false,
};

pub static PG_BIN: Setting<Text> = Setting {
    var: "PGLIMIT_PG_BIN",
    flag: "pg-bin",
    values: Text,
    unset: Means("PATH, then the newest /usr/lib/postgresql/<version>/bin"),
    help: "Zero-config only: directory of initdb and pg_ctl.",
    secret: false,
};

pub static CLEANUP_RATE: Setting<Range<f64>> = Setting {
    var: "PGLIMIT_CLEANUP_RATE",
    flag: "cleanup-rate",
    values: Range { noun: "a fraction", min: 0.0, max: 1.0 },
    unset: Is("0.01"),
    help: "Fraction of checks that start a background delete of expired rows.",
    secret: false,
};

pub static DB_TIMEOUT_MS: Setting<Range<u64>> = Setting {
    var: "PGLIMIT_DB_TIMEOUT_MS",
    flag: "db-timeout-ms",
    values: Range { noun: "milliseconds", min: 10, max: 60_000 },
    unset: Is("250"),
    help: "Milliseconds Postgres may make no progress before the instance falls back to memory.",
    secret: false,
};

pub static DB_POOL_SIZE: Setting<Range<u32>> = Setting {
    var: "PGLIMIT_DB_POOL_SIZE",
    flag: "db-pool-size",
    values: Range { noun: "a number of connections", min: 1, max: 1000 },
    unset: Is("4"),
    help: "Connections per instance for checks: PGLIMIT_DB_PIPELINE of them with calls in flight at \
           once, the rest spares for when calls stall. Unset with PGLIMIT_DB_MAX_CONNECTIONS: what that \
           leaves.",
    secret: false,
};

pub static DB_PIPELINE: Setting<Range<u32>> = Setting {
    var: "PGLIMIT_DB_PIPELINE",
    flag: "db-pipeline",
    values: Range { noun: "a number of calls", min: 1, max: 1000 },
    unset: Is("1"),
    help: "Calls to Postgres in flight at once, so that one commits while the next runs; at most \
           PGLIMIT_DB_POOL_SIZE.",
    secret: false,
};

pub static DB_MAX_CONNECTIONS: Setting<Range<u32>> = Setting {
    var: "PGLIMIT_DB_MAX_CONNECTIONS",
    flag: "db-max-connections",
    values: Range { noun: "a number of connections", min: 1, max: 10_000 },
    unset: Means("no bound"),
    help: "Most connections one instance opens to Postgres, the kept ones included: sets \
           PGLIMIT_DB_POOL_SIZE to what remains.",
    secret: false,
};

pub static DB_POOLER: Setting<OneOf<Pooler>> = Setting {
    var: "PGLIMIT_DB_POOLER",
    flag: "db-pooler",
    values: OneOf(&[
        ("none", Pooler::None),
        ("session", Pooler::Session),
        ("transaction", Pooler::Transaction),
    ]),
    unset: Is("none"),
    help: "The connection pooler DATABASE_URL goes through, and its pool mode.",
    secret: false,
};

pub static DB_SCHEMA: Setting<SchemaName> = Setting {
    var: "PGLIMIT_DB_SCHEMA",
    flag: "db-schema",
    values: SchemaName,
    unset: Means("the role's search path"),
    help: "The schema pglimit's tables and functions live in, created by `pglimit migrate` if missing.",
    secret: false,
};

pub static UNLOGGED: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_UNLOGGED",
    flag: "unlogged",
    values: BOOLEAN,
    unset: Is("false"),
    help: "Counters in an UNLOGGED table, cheaper writes but emptied after a crash; set on a new, empty \
           table only.",
    secret: false,
};

pub static CITUS: Setting<OneOf<Citus>> = Setting {
    var: "PGLIMIT_CITUS",
    flag: "citus",
    values: OneOf(&[("auto", Citus::Auto), ("true", Citus::On), ("false", Citus::Off)]),
    unset: Is("auto"),
    help: "Distribute the counters over a Citus cluster, each call on one shard; auto: when the citus \
           extension is there.",
    secret: false,
};

pub static CITUS_CHECKS: Setting<OneOf<CitusChecks>> = Setting {
    var: "PGLIMIT_CITUS_CHECKS",
    flag: "citus-checks",
    values: OneOf(&[("workers", CitusChecks::Workers), ("coordinator", CitusChecks::Coordinator)]),
    unset: Is("workers"),
    help: "In Citus mode, send each check straight to the worker holding its shard (reachable as \
           pg_dist_node names it), or through the coordinator.",
    secret: false,
};
