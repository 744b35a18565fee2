//! A cooperative stop request (SIGTERM/SIGINT): jobs check it at safe boundaries — between
//! batches and before starting a schema — and finish the step they are in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cloneable stop flag.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// A flag nobody has raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every holder to stop at its next safe boundary.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
