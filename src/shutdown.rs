//! A cooperative stop request (SIGTERM/SIGINT): jobs check it at safe boundaries — between
//! batches and before starting a schema — and finish the step they are in. A job that is only
//! waiting (for a read, say) can wait for the request instead and stop at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// A cloneable stop flag.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<Flag>);

#[derive(Debug, Default)]
struct Flag {
    raised: AtomicBool,
    raised_now: Notify,
}

impl Shutdown {
    /// A flag nobody has raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every holder to stop at its next safe boundary.
    pub fn request(&self) {
        self.0.raised.store(true, Ordering::SeqCst);
        self.0.raised_now.notify_waiters();
    }

    /// True once a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.0.raised.load(Ordering::SeqCst)
    }

    /// Completes once a stop is requested (at once if it already was).
    pub async fn requested(&self) {
        loop {
            let raised = self.0.raised_now.notified();
            tokio::pin!(raised);
            // Registered before the flag is read, so a request in between is not missed.
            raised.as_mut().enable();
            if self.is_requested() {
                return;
            }
            raised.await;
        }
    }
}

/// Raises the shutdown flag on the first SIGTERM or SIGINT; a second one exits at once (with
/// 128 + the signal number, as a shell reports it). Every step is safe to cut short: what a
/// killed run leaves behind is unlisted, and unmarked rows stay dirty.
pub fn watch_signals(shutdown: Shutdown) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        let mut requested = false;
        loop {
            let code = tokio::select! {
                _ = term.recv() => 143,
                _ = int.recv() => 130,
            };
            if requested {
                tracing::warn!("second stop request: exiting now");
                std::process::exit(code);
            }
            requested = true;
            tracing::warn!("stop requested: finishing the current step (signal again to exit now)");
            shutdown.request();
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Shutdown;

    #[tokio::test]
    async fn a_waiter_wakes_on_a_request_made_before_or_while_it_waits() {
        let early = Shutdown::new();
        early.request();
        tokio::time::timeout(Duration::from_secs(5), early.requested())
            .await
            .expect("an earlier request is seen");
        let later = Shutdown::new();
        let waiter = tokio::spawn({
            let later = later.clone();
            async move { later.requested().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        later.request();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a waiter wakes")
            .unwrap();
    }
}
