//! The per-schema advisory lock: `pg_try_advisory_lock(id, id)` (the two-int4 keyspace) held by
//! one dedicated connection for the whole job, released on that same connection (docs/hazards.md
//! #290) — or, if the process dies, by PostgreSQL when the connection closes.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::connect::{Connector, timed};
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;

/// How often a job waiting for a held schema lock tries again.
const LOCK_RETRY: Duration = Duration::from_millis(250);

/// A held schema lock. Dropping it closes the connection, which also releases the lock.
#[derive(Debug)]
pub struct SchemaLock {
    client: Client,
    schema_id: i16,
    backend_pid: i32,
    connector: Connector,
    /// False once [`Self::let_go`] gave the lock back (a dry run's).
    held: bool,
}

impl SchemaLock {
    /// Tries to take the lock on a new dedicated connection; `Ok(None)` when another session
    /// holds it.
    pub async fn try_acquire(connector: &Connector, schema_id: i16) -> Result<Option<Self>> {
        Self::acquire(connector, schema_id, Duration::ZERO, &Shutdown::new()).await
    }

    /// Takes the lock on a new dedicated connection, trying again for up to `wait` while
    /// another session holds it (a flush holds a schema for seconds each minute, so a
    /// maintenance job started beside it waits its turn instead of reporting `locked`);
    /// `Ok(None)` when it is still held after `wait`, or at once on a stop request.
    pub async fn acquire(
        connector: &Connector,
        schema_id: i16,
        wait: Duration,
        shutdown: &Shutdown,
    ) -> Result<Option<Self>> {
        let client = connector.connect().await?;
        let limit = connector.statement_timeout();
        let started = Instant::now();
        let mut logged = false;
        let row = loop {
            let row = timed(
                limit,
                "take schema lock",
                client.query_one(
                    "SELECT pg_try_advisory_lock($1::int4, $1::int4), pg_backend_pid()",
                    &[&i32::from(schema_id)],
                ),
            )
            .await?;
            if row.get::<_, bool>(0) {
                break row;
            }
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() || shutdown.is_requested() {
                return Ok(None);
            }
            if !logged {
                tracing::info!(
                    schema_id,
                    wait_s = wait.as_secs_f64(),
                    "another session holds the schema lock: waiting for it (--lock-wait)"
                );
                logged = true;
            }
            tokio::select! {
                () = shutdown.requested() => return Ok(None),
                () = tokio::time::sleep(left.min(LOCK_RETRY)) => {}
            }
        };
        // The lock's connection is idle while the job works; a server-wide
        // `idle_session_timeout` (PostgreSQL 14+) would close it and so drop the lock. Older
        // servers do not know the setting: nothing to turn off there.
        if let Err(e) = timed(
            limit,
            "keep the lock session open",
            client.batch_execute("SET idle_session_timeout = 0"),
        )
        .await
        {
            tracing::debug!(error = %e.chain(), "idle_session_timeout not set");
        }
        Ok(Some(Self {
            backend_pid: row.get(1),
            client,
            schema_id,
            connector: connector.clone(),
            held: true,
        }))
    }

    /// Gives the lock back at once, keeping the session: a dry run learns that the schema was
    /// free, as the real run would, without keeping a real run out while it plans. What it
    /// plans publishes nothing, so [`Self::ensure_held`] and [`Self::ensure_open`] then fail.
    pub async fn let_go(mut self) -> Result<Self> {
        self.unlock().await?;
        self.held = false;
        Ok(self)
    }

    async fn unlock(&self) -> Result<bool> {
        let row = timed(
            self.connector.statement_timeout(),
            "release schema lock",
            self.client.query_one(
                "SELECT pg_advisory_unlock($1::int4, $1::int4)",
                &[&i32::from(self.schema_id)],
            ),
        )
        .await?;
        Ok(row.get(0))
    }

    /// The schema this lock protects.
    pub fn schema_id(&self) -> i16 {
        self.schema_id
    }

    /// The PostgreSQL backend pid holding the lock.
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Errs unless the lock's session is still alive — and so still holds the lock, which only
    /// ends with the session or an unlock on it. Checked before publishing what was prepared
    /// under the lock.
    pub async fn ensure_held(&self) -> Result<()> {
        if !self.held {
            return Err(self.lost(self.not_held()));
        }
        // Asked on the lock's own session (it fails once that session is gone), and answered
        // by pg_locks: the backend that took the lock must still be its holder.
        let held = holder(&self.client, self.schema_id)
            .await
            .and_then(|h| match h {
                Some(h) if h.pid == self.backend_pid => Ok(()),
                _ => Err(self.not_held()),
            });
        held.map_err(|e| self.lost(e))
    }

    /// Errs once the lock's session is known to be gone (the server ended it, or its
    /// connection closed): the lock went with it. Asks nothing of the server, so a flush
    /// checks it before every batch it publishes; [`Self::ensure_held`] asks.
    pub fn ensure_open(&self) -> Result<()> {
        if !self.held || self.client.is_closed() {
            return Err(self.lost(self.not_held()));
        }
        Ok(())
    }

    fn not_held(&self) -> Error {
        Error::LockNotHeld {
            backend_pid: self.backend_pid,
        }
    }

    /// The lock is gone, because of `source`.
    fn lost(&self, source: Error) -> Error {
        Error::LockLost {
            schema_id: self.schema_id,
            source: Box::new(source),
        }
    }

    /// The lock's own connection (for work that must run inside the lock's session).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Releases the lock on the connection that took it, then closes that connection.
    /// Returns whether PostgreSQL confirmed the release.
    pub async fn release(self) -> Result<bool> {
        if !self.held {
            return Ok(true);
        }
        self.unlock().await
    }
}

/// The session holding a schema's lock, as PostgreSQL reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LockHolder {
    /// Backend pid.
    pub pid: i32,
    /// The holder's `application_name` (lakecdc sets `lakecdc`).
    pub application_name: String,
    /// When the holding session started (the lock's connection is dedicated), epoch ms.
    pub since_ms: i64,
    /// Client address, when connected over TCP.
    pub client_addr: Option<String>,
}

/// Who holds `schema_id`'s lock, from `pg_locks` and `pg_stat_activity`; never takes it.
pub(crate) async fn holder(client: &Client, schema_id: i16) -> Result<Option<LockHolder>> {
    let row = timed(
        std::time::Duration::from_secs(30),
        "read lock holder",
        client.query_opt(
            "SELECT a.pid, COALESCE(a.application_name, ''), \
             (extract(epoch FROM a.backend_start) * 1000)::int8, host(a.client_addr) \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
             AND l.classid = $1::int4::oid AND l.objid = $1::int4::oid AND l.database = \
             (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1",
            &[&i32::from(schema_id)],
        ),
    )
    .await?;
    Ok(row.map(|r| LockHolder {
        pid: r.get(0),
        application_name: r.get(1),
        since_ms: r.get(2),
        client_addr: r.get(3),
    }))
}
