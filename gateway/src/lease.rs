//! The gateway's lease: one process of those running with a bot's token holds the
//! connection; the others stand by. The holder renews the lease every third of its
//! length and saves with it the session's resume point and its state; a process that
//! cannot renew in time closes its connection, so two never answer at once. A successor
//! resumes the saved session, and Discord replays what came while nobody was connected.

use std::time::Duration;

use pulse_shared::discord::GatewayRecord;
use pulse_shared::error::chain;
use tokio::sync::watch;
use tracing::{info, warn};
use twilight_gateway::Shard;

use crate::{Gateway, lock};

impl Gateway {
    /// Waits until this process holds the lease, standing by meanwhile; then the saved
    /// session to resume, if there is one. `None` when stopped first.
    pub(crate) async fn stand_by(
        &self,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Option<(String, u64, String)>> {
        let mut said = false;
        loop {
            match self.take().await {
                Ok(Some(resume)) => return Some(resume),
                Ok(None) => {
                    if !said {
                        info!(lease = %self.lease_name, "another process holds the Discord gateway; standing by");
                        said = true;
                    }
                    self.set_state("standby", None);
                }
                Err(why) => {
                    warn!(error = %why, "cannot read the Discord gateway's lease; trying again");
                    self.set_state("standby", Some(why));
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.settings.lease / 3) => {}
                _ = stop.wait_for(|s| *s) => return None,
            }
        }
    }

    /// Takes the lease if it is free: `Some` with the session its last holder saved.
    async fn take(&self) -> Result<Option<Option<(String, u64, String)>>, String> {
        let store = self.store.as_ref();
        let before = store
            .get_lease(&self.lease_name)
            .await
            .map_err(|e| chain(&e))?;
        let saved: GatewayRecord = before
            .as_ref()
            .and_then(|l| serde_json::from_value(l.state.clone()).ok())
            .unwrap_or_default();
        {
            let mut s = lock(&self.status);
            s.session_id = saved.session_id.clone();
            s.sequence = saved.sequence;
            s.resume_url = saved.resume_url.clone();
            s.bot_user = saved.bot_user.clone();
            s.state = "connecting".into();
        }
        // A resumed session gets no READY: the bot's id comes from the last holder.
        if saved.bot_user.is_some() {
            *lock(&self.bot) = saved.bot_user.clone();
        }
        if !self.hold().await? {
            return Ok(None);
        }
        *lock(&self.renewed) = Some(std::time::Instant::now());
        Ok(Some(saved.resumable().map(|(id, seq, url)| {
            (id.to_owned(), seq, url.to_owned())
        })))
    }

    /// Writes the lease for another term with the state as it is.
    async fn hold(&self) -> Result<bool, String> {
        let now = self.clock.now();
        let until = now.checked_add(self.settings.lease).unwrap_or(now);
        let state = serde_json::to_value(self.status()).unwrap_or_default();
        self.store
            .hold_lease(&self.lease_name, &self.holder, now, until, &state)
            .await
            .map_err(|e| chain(&e))
    }

    /// Notes the shard's resume point in the state saved with the lease.
    pub(crate) fn remember(&self, shard: &Shard) {
        let mut s = lock(&self.status);
        if let Some(session) = shard.session() {
            s.session_id = Some(session.id().to_owned());
            s.sequence = Some(session.sequence());
        }
        if let Some(url) = shard.resume_url() {
            s.resume_url = Some(url.to_owned());
        }
    }

    /// Renews the lease with the resume point [`Self::remember`] noted. `false` when another process
    /// holds it now, or when it could not be renewed for a whole term (the store down):
    /// then another may hold it, and this one must stop.
    pub(crate) async fn renew(&self) -> bool {
        match self.hold().await {
            Ok(true) => {
                *lock(&self.renewed) = Some(std::time::Instant::now());
                true
            }
            Ok(false) => false,
            Err(why) => {
                let since = lock(&self.renewed).map_or(Duration::MAX, |at| at.elapsed());
                warn!(error = %why, "cannot renew the Discord gateway's lease");
                since < self.settings.lease
            }
        }
    }

    /// Gives the lease up with the resume point, so a successor takes over at once.
    pub(crate) async fn give_up(&self) {
        let state = serde_json::to_value(self.status()).unwrap_or_default();
        if let Err(e) = self
            .store
            .release_lease(&self.lease_name, &self.holder, self.clock.now(), &state)
            .await
        {
            warn!(error = %chain(&e), "cannot give the Discord gateway's lease up; it runs out by itself");
        }
    }
}
