//! Integration tests against the real services started by `scripts/services.sh` (PostgreSQL and
//! SeaweedFS). `scripts/test.sh` exports `LAKECDC_TEST_PG_URL`, `LAKECDC_TEST_S3_ENDPOINT` and
//! the cluster's TLS and password fixtures (`LAKECDC_TEST_PG_*`, see `support::harness::pg_fixtures`);
//! tests that need a service fail with a clear message when they are missing, never skip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
#![allow(unreachable_pub)] // modules of one test binary share helpers with `pub`

mod attach;
mod cli;
mod compact;
mod compact_faults;
mod compact_ranges;
mod copy_tap;
mod crash;
mod deploy;
mod docs;
mod doctor;
mod engine;
mod flush;
mod flush_select;
mod gc;
mod gc_faults;
mod gc_settle;
mod history;
mod hostile_lake;
mod init;
mod init_db;
mod inspect;
mod layering;
mod local_symlinks;
mod manifest;
mod metrics;
mod oracle_at_scale;
mod query;
mod registry_names;
mod requeue;
mod source;
mod source_identity;
mod store_conformance;
mod support;
mod table_source;
mod tls;
mod transport;
mod verify;
mod verify_source;
mod view;
