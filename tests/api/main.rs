//! Integration tests: one binary, real Postgres, real HTTP, the mock provider
//! as the only fake.

mod contract;
mod delivery;
mod durability;
mod helpers;
mod outage;
mod process;
