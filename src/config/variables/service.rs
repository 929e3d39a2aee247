//! The variables of the service: where it listens, who may call it, and
//! how it behaves.

use std::time::Duration;

use crate::config::setting::{Address, OneOf, Range, Setting, Span, Text, Unset::*, BOOLEAN};
use crate::config::LogFormat;

pub static BIND: Setting<Address> = Setting {
    var: "PGLIMIT_BIND",
    flag: "bind",
    values: Address { example: "127.0.0.1:8080" },
    unset: Is("127.0.0.1:8080"),
    help: "Address to listen on. Without API tokens, only a loopback address is accepted.",
    secret: false,
};

pub static GRPC_BIND: Setting<Address> = Setting {
    var: "PGLIMIT_GRPC_BIND",
    flag: "grpc-bind",
    values: Address { example: "127.0.0.1:8081" },
    unset: Means("not served"),
    help: "Address of Envoy's rate limit service (gRPC). Without API tokens, only a loopback address \
           is accepted.",
    secret: false,
};

pub static POLICIES: Setting<Text> = Setting {
    var: "PGLIMIT_POLICIES",
    flag: "policies",
    values: Text,
    unset: Means("the built-ins, login and contact_confirmation"),
    help: "Policy file (TOML), replacing the built-in policies.",
    secret: false,
};

pub static API_TOKENS: Setting<Text> = Setting {
    var: "PGLIMIT_API_TOKENS",
    flag: "api-tokens",
    values: Text,
    unset: Means("none: /check open, loopback only"),
    help: "Comma-separated bearer tokens accepted on /check.",
    secret: true,
};

pub static API_TOKENS_FILE: Setting<Text> = Setting {
    var: "PGLIMIT_API_TOKENS_FILE",
    flag: "api-tokens-file",
    values: Text,
    unset: Means("none"),
    help: "A file holding the API tokens, separated by commas or newlines; not with PGLIMIT_API_TOKENS.",
    secret: false,
};

pub static ADMIN_TOKENS: Setting<Text> = Setting {
    var: "PGLIMIT_ADMIN_TOKENS",
    flag: "admin-tokens",
    values: Text,
    unset: Means("none: admin routes on a loopback bind only, open"),
    help: "Comma-separated bearer tokens of the admin routes (/admin/...), each a secret or \
           name:secret; the audit log names who acted by the name, else by a fingerprint.",
    secret: true,
};

pub static ADMIN_TOKENS_FILE: Setting<Text> = Setting {
    var: "PGLIMIT_ADMIN_TOKENS_FILE",
    flag: "admin-tokens-file",
    values: Text,
    unset: Means("none"),
    help: "A file holding the admin tokens, separated by commas or newlines; not with \
           PGLIMIT_ADMIN_TOKENS.",
    secret: false,
};

pub static MEMORY_CAPACITY: Setting<Range<usize>> = Setting {
    var: "PGLIMIT_MEMORY_CAPACITY",
    flag: "memory-capacity",
    values: Range { noun: "a number of keys", min: 1, max: 100_000_000 },
    unset: Is("100000"),
    help: "Most keys the memory fallback holds per instance, and denials remembered.",
    secret: false,
};

pub static LOG_FORMAT: Setting<OneOf<LogFormat>> = Setting {
    var: "PGLIMIT_LOG_FORMAT",
    flag: "log-format",
    values: OneOf(&[("text", LogFormat::Text), ("json", LogFormat::Json)]),
    unset: Is("text"),
    help: "How log lines are written; their levels come from RUST_LOG.",
    secret: false,
};

pub static METRICS: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_METRICS",
    flag: "metrics",
    values: BOOLEAN,
    unset: Is("true"),
    help: "Serve /metrics.",
    secret: false,
};

pub static METRICS_TOKEN: Setting<Text> = Setting {
    var: "PGLIMIT_METRICS_TOKEN",
    flag: "metrics-token",
    values: Text,
    unset: Means("none: open on a loopback bind, else this or an API token"),
    help: "Bearer token for /metrics.",
    secret: true,
};

pub static METRICS_TOKEN_FILE: Setting<Text> = Setting {
    var: "PGLIMIT_METRICS_TOKEN_FILE",
    flag: "metrics-token-file",
    values: Text,
    unset: Means("none"),
    help: "A file holding the metrics token, its trailing newline dropped; not with \
           PGLIMIT_METRICS_TOKEN.",
    secret: false,
};

pub static SHADOW: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_SHADOW",
    flag: "shadow",
    values: BOOLEAN,
    unset: Is("false"),
    help: "Every policy in shadow mode, decided and counted but never refused.",
    secret: false,
};

pub static WATCH_POLICIES: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_WATCH_POLICIES",
    flag: "watch-policies",
    values: BOOLEAN,
    unset: Is("true"),
    help: "Reload the policy file when a new version is closed or renamed into place; SIGHUP always \
           reloads it.",
    secret: false,
};

pub static REQUEST_TIMEOUT_MS: Setting<Range<u64>> = Setting {
    var: "PGLIMIT_REQUEST_TIMEOUT_MS",
    flag: "request-timeout-ms",
    values: Range { noun: "milliseconds", min: 1, max: 3_600_000 },
    unset: Means("30000, or 20 × PGLIMIT_DB_TIMEOUT_MS + 5000 if longer"),
    help: "Longest a request may take before a 503, at least 20 × PGLIMIT_DB_TIMEOUT_MS + 5000.",
    secret: false,
};

pub static SLOW_CHECKS: Setting<Range<usize>> = Setting {
    var: "PGLIMIT_SLOW_CHECKS",
    flag: "slow-checks",
    values: Range { noun: "a number of checks", min: 0, max: 100_000 },
    unset: Is("128"),
    help: "The slowest checks kept, with their phases, for GET /admin/slow-checks; 0 keeps none.",
    secret: false,
};

pub static MAX_WAITING: Setting<Range<usize>> = Setting {
    var: "PGLIMIT_MAX_WAITING",
    flag: "max-waiting",
    values: Range { noun: "a number of checks", min: 0, max: 1_000_000 },
    unset: Is("500"),
    help: "Most checks held by max_wait at once per instance, a tenth of them (rounded up) per key waited \
           on; past either a check answers at once. 0: none held.",
    secret: false,
};

pub static WORKER_THREADS: Setting<Range<usize>> = Setting {
    var: "PGLIMIT_WORKER_THREADS",
    flag: "worker-threads",
    values: Range { noun: "a number of threads", min: 1, max: 1024 },
    unset: Means("one per CPU"),
    help: "Threads that serve requests; 1 costs less CPU per check where the service shares a small \
           machine.",
    secret: false,
};

pub static CONSOLE: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_CONSOLE",
    flag: "console",
    values: OneOf(&[("on", true), ("off", false)]),
    unset: Is("off"),
    help: "Serve the support console at /console; needs PGLIMIT_ADMIN_TOKENS, which its calls send.",
    secret: false,
};

pub static SQL: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_SQL",
    flag: "sql",
    values: OneOf(&[("on", true), ("off", false)]),
    unset: Is("off"),
    help:
        "Write the key secret into the database (as HMAC pads only their owner reads) so that pglimit.check \
           can key checks made from SQL; off keeps the secret out of the database.",
    secret: false,
};

pub static AUDIT_RETENTION: Setting<Span> = Setting {
    var: "PGLIMIT_AUDIT_RETENTION",
    flag: "audit-retention",
    values: Span { min: Duration::from_secs(3600), max: Duration::from_secs(3660 * 86_400) },
    unset: Is("90d"),
    help: "How long the audit log (GET /admin/audit) keeps a row; older ones are deleted by the \
           background cleanup.",
    secret: false,
};

pub static TOP: Setting<OneOf<bool>> = Setting {
    var: "PGLIMIT_TOP",
    flag: "top",
    values: OneOf(&[("on", true), ("off", false)]),
    unset: Is("on"),
    help: "Count denials per key for GET /admin/top (written every 5 s); off: nothing counted.",
    secret: false,
};

pub static TOP_RETENTION: Setting<Span> = Setting {
    var: "PGLIMIT_TOP_RETENTION",
    flag: "top-retention",
    values: Span { min: Duration::from_secs(60), max: Duration::from_secs(366 * 86_400) },
    unset: Is("7d"),
    help: "How long the top list keeps each minute of denials before the cleanup deletes it.",
    secret: false,
};
