//! PostgreSQL: connecting (DSN, TLS), the per-schema advisory lock, the schema registry,
//! `change_log` statistics, the `init-db` DDL, and query results read straight off the wire
//! (`copy_tap`). PostgreSQL types never leave this module
//! except the `Client` handle the jobs pass back into it.

pub mod connect;
pub mod conninfo;
pub mod copy_tap;
pub mod ddl;
pub mod lock;
pub mod registry;
pub mod snapshot;
pub mod stats;
mod tls_connector;

pub use connect::{Connector, PgSettings, TlsPolicy};
pub use lock::SchemaLock;
pub use tokio_postgres::Client;
