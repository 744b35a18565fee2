//! PostgreSQL: connecting (DSN, TLS), the per-schema advisory lock, the schema registry,
//! `change_log` statistics, the `init-db` DDL, the catalog (privileges, columns, version), and
//! query results read straight off the wire (`copy_tap`). PostgreSQL types never leave this
//! module except the `Client` handle the jobs pass back into it.

pub mod attach;
pub mod capture;
pub mod catalog;
pub mod connect;
pub mod conninfo;
mod copy_decoder;
pub mod copy_tap;
pub mod ddl;
mod decoding;
pub mod heap_read;
mod identity;
pub mod live;
pub(crate) mod lock;
mod password_guard;
pub(crate) mod registry;
pub mod repair;
pub mod requeue;
mod rows;
pub mod snapshot;
mod socket;
pub mod stats;
pub mod table_requeue;
pub mod table_rows;
pub mod table_source;
pub mod table_types;
mod tls_connector;
pub mod versions;

pub use connect::{Connector, PgSettings, TlsPolicy};
pub use identity::identify;
pub use lock::SchemaLock;
pub use tokio_postgres::Client;

/// The longest one statement of a read (a batch, a page, a mark) may take.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
