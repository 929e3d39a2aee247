//! The API against one real PostgreSQL, shared by every test here (each
//! test in a database of its own): tests that stop their cluster live in
//! binaries of their own (`fallback`, `network`, `process`, `restart`).

#[path = "../common/mod.rs"]
mod common;

mod actions;
mod adhoc;
mod algorithms;
mod api_overrides;
mod api_overrides_errors;
mod audit;
mod audit_pages;
mod batch_functions;
mod calendar;
mod cleanup;
mod concurrency;
mod console;
mod errors;
mod explain;
mod forward_auth;
mod guard;
mod lane;
mod lease_life;
mod openapi;
mod operate;
mod overrides;
mod policies;
mod privileges;
mod properties;
mod replay;
mod slow_checks;
mod sql_access;
mod sql_identifiers;
mod sql_interface;
mod sql_mixed;
mod sql_replay;
mod stalls;
mod top;
mod waiting;
mod waiting_errors;
mod waiting_leases;
