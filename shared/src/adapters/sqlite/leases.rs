//! Leases on SQLite: one row per name, taken or renewed by one conditional upsert.

use async_trait::async_trait;
use jiff::Timestamp;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{CachedExecute, SqliteStore, sqlite_err};
use crate::domain::{from_ms, to_ms};
use crate::error::StoreError;
use crate::ports::{Lease, LeaseStore};

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        until: Timestamp,
        state: &Value,
    ) -> Result<bool, StoreError> {
        let (name, holder, state) = (name.to_owned(), holder.to_owned(), state.to_string());
        self.db
            .call("hold lease", move |conn| {
                let n = conn
                    .exec(
                        "INSERT INTO leases (name, holder, until_ms, state) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,
                             until_ms = excluded.until_ms, state = excluded.state
                         WHERE leases.holder = excluded.holder OR leases.until_ms <= ?5",
                        params![name, holder, to_ms(until), state, to_ms(now)],
                    )
                    .map_err(sqlite_err("hold lease"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn get_lease(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        let name = name.to_owned();
        self.db
            .call("read lease", move |conn| {
                let row = conn
                    .prepare_cached("SELECT holder, until_ms, state FROM leases WHERE name = ?1")
                    .and_then(|mut st| {
                        st.query_row([&name], |r| {
                            Ok((
                                r.get::<_, String>(0)?,
                                r.get::<_, i64>(1)?,
                                r.get::<_, String>(2)?,
                            ))
                        })
                        .optional()
                    })
                    .map_err(sqlite_err("read lease"))?;
                row.map(|(holder, until, state)| {
                    Ok(Lease {
                        name: name.clone(),
                        holder,
                        until: from_ms(until),
                        state: serde_json::from_str(&state)
                            .map_err(|e| StoreError::corrupt("leases", e))?,
                    })
                })
                .transpose()
            })
            .await
    }

    async fn release_lease(
        &self,
        name: &str,
        holder: &str,
        now: Timestamp,
        state: &Value,
    ) -> Result<(), StoreError> {
        let (name, holder, state) = (name.to_owned(), holder.to_owned(), state.to_string());
        self.db
            .call("release lease", move |conn| {
                conn.exec(
                    "UPDATE leases SET until_ms = ?3, state = ?4 WHERE name = ?1 AND holder = ?2",
                    params![name, holder, to_ms(now), state],
                )
                .map_err(sqlite_err("release lease"))?;
                Ok(())
            })
            .await
    }
}
