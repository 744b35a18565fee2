//! Bounded retries with exponential backoff and jitter: one helper for every step that retries
//! (the manifest commit after a confirmed conflict, a compaction pass that lost a race to
//! another writer). Which errors may be retried is [`crate::Error::is_retryable`]'s call.

use std::time::Duration;

/// Exponential backoff: `base · 2^(retry-1)`, capped at `max`, jittered ×[0.5, 1.5) so that
/// writers that collided do not collide again in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// The wait before retry number `retry` (1 for the first).
    pub fn delay(&self, retry: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16))
            .min(self.max);
        let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0 + 0.5;
        exp.mul_f64(jitter)
    }

    /// Sleeps before retry number `retry`.
    pub async fn wait(&self, retry: u32) {
        tokio::time::sleep(self.delay(retry)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_up_to_the_cap_within_the_jitter() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for (retry, nominal) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (30, 1000),
        ] {
            let d = b.delay(retry).as_millis();
            assert!(
                d >= nominal / 2 && d < nominal * 3 / 2,
                "retry {retry}: {d}ms"
            );
        }
    }
}
