//! Which database a connection reads: its cluster's system identifier and the database name
//! (docs/design.md §10, "Source identity"). `pg_control_system()` is executable by every role.

use tokio_postgres::Client;

use super::READ_TIMEOUT as TIMEOUT;
use super::connect::timed;
use crate::error::Result;

/// The cluster's system identifier and the database's name.
pub async fn identify(client: &Client) -> Result<(i64, String)> {
    let row = timed(
        TIMEOUT,
        "read the source's identity",
        client.query_one(
            "SELECT system_identifier, current_database()::text FROM pg_control_system()",
            &[],
        ),
    )
    .await?;
    Ok((row.get(0), row.get(1)))
}
