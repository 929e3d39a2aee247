//! A server other than the URL's that connections may go straight to:
//! in Citus mode, a worker holding pglimit's shards ([`super::citus`]).

/// A node as the coordinator's `pg_dist_node` names it: its group, and
/// where it listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Node {
    pub group: i32,
    pub host: String,
    pub port: u16,
}
