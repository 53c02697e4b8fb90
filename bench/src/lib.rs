//! What the load generator (`loadgen`) and the chaos run (`chaos`) share:
//! the binaries they start, free ports, a database of their own, readiness,
//! process statistics from /proc, the mock provider's counts, a throwaway
//! Postgres cluster the chaos run may restart, and the npm SMSC it may use.

pub mod db;
pub mod pg;
pub mod procs;
pub mod smsc;
pub mod stats;
