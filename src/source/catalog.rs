//! What the server's catalog says about this connection and the source tables, for
//! `lakecdc doctor` (docs/operations.md): the server's version and clock, the role's privileges
//! on the source tables, whether the role can take the advisory locks the jobs take, and the
//! columns of a table and their types (also what the readers ask before reading). Every
//! statement runs under a time limit and changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio_postgres::{Client, GenericClient};

use super::connect::timed;
use crate::config::TableName;
use crate::error::Result;

const TIMEOUT: Duration = Duration::from_secs(30);

/// The key doctor locks and unlocks, in the two-int4 keyspace of the schema locks
/// ([`super::SchemaLock`]) so that the same function is exercised; its two halves differ,
/// which no schema lock's (`(id, id)`) do.
const DOCTOR_LOCK: (i32, i32) = (0x6c61_6b65, 0x646f_6374);

/// The server as this connection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `server_version`.
    pub version: String,
    /// The role connected (`current_user`).
    pub role: String,
    /// `now()`, epoch milliseconds.
    pub now_ms: i64,
}

/// The server's version, the connected role and the server's clock.
pub async fn server(client: &Client) -> Result<Server> {
    let row = timed(
        TIMEOUT,
        "read server version",
        client.query_one(
            "SELECT current_setting('server_version'), current_user::text, \
             (extract(epoch FROM now()) * 1000)::int8",
            &[],
        ),
    )
    .await?;
    Ok(Server {
        version: row.get(0),
        role: row.get(1),
        now_ms: row.get(2),
    })
}

/// A table's privilege for the connected role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// Granted.
    Granted,
    /// Not granted.
    Missing,
    /// The table does not exist.
    NoTable,
}

/// Whether the connected role has `privilege` (`SELECT`, `UPDATE`, …) on `table`.
pub async fn table_privilege(
    client: &Client,
    table: &TableName,
    privilege: &str,
) -> Result<Privilege> {
    let row = timed(
        TIMEOUT,
        "check table privilege",
        client.query_one(
            "SELECT to_regclass($1) IS NOT NULL, \
             COALESCE(has_table_privilege(to_regclass($1), $2), false)",
            &[&table.quoted(), &privilege],
        ),
    )
    .await?;
    Ok(match (row.get(0), row.get(1)) {
        (false, _) => Privilege::NoTable,
        (true, true) => Privilege::Granted,
        (true, false) => Privilege::Missing,
    })
}

/// Takes and releases an advisory lock with the function the schema locks use: `Ok(true)`
/// when taken and released, `Ok(false)` when another session holds doctor's key (the function
/// worked all the same); an error when the role may not call it.
pub async fn advisory_lock_usable(client: &Client) -> Result<bool> {
    let (a, b) = DOCTOR_LOCK;
    let taken: bool = timed(
        TIMEOUT,
        "take an advisory lock",
        client.query_one("SELECT pg_try_advisory_lock($1::int4, $2::int4)", &[&a, &b]),
    )
    .await?
    .get(0);
    if taken {
        timed(
            TIMEOUT,
            "release an advisory lock",
            client.query_one("SELECT pg_advisory_unlock($1::int4, $2::int4)", &[&a, &b]),
        )
        .await?;
    }
    Ok(taken)
}

/// The columns of `table` (none when it does not exist).
pub async fn columns(client: &Client, table: &TableName) -> Result<BTreeSet<String>> {
    let rows = timed(
        TIMEOUT,
        "read table columns",
        client.query(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            &[&table.quoted()],
        ),
    )
    .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Whether column `column` of `table` has the type `type_name` (a `regtype` name); `false`
/// when the table or the column does not exist.
pub async fn column_has_type(
    client: &impl GenericClient,
    table: &TableName,
    column: &str,
    type_name: &str,
) -> Result<bool> {
    let row = timed(
        TIMEOUT,
        "read a column's type",
        client.query_opt(
            "SELECT a.atttypid = $3::text::regtype FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attname = $2::text AND NOT a.attisdropped",
            &[&table.quoted(), &column, &type_name],
        ),
    )
    .await?;
    Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
}
