//! A TCP proxy in front of the S3 server that can cut every connection at once and turn new
//! ones away for a while — what a client sees when the server crashes and restarts — without
//! touching the server the other tests share.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The proxy's state, shared with its accept loop.
#[derive(Default)]
struct State {
    /// The connections being relayed.
    live: Vec<AbortHandle>,
    /// New connections are dropped at once until then.
    down_until: Option<Instant>,
}

/// A running proxy; it stops when dropped.
pub struct Proxy {
    /// `http://127.0.0.1:port`.
    pub url: String,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

impl Proxy {
    /// Relays connections to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Self {
        let to = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut s = shared.lock().unwrap();
                if s.down_until.is_some_and(|t| Instant::now() < t) {
                    // Down: the connection is closed unanswered.
                    continue;
                }
                let to = to.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                s.live.retain(|h| !h.is_finished());
                s.live.push(relay.abort_handle());
            }
        })
        .abort_handle();
        Self { url, state, accept }
    }

    /// Waits until the proxy takes connections again (the last cut's outage is over).
    pub async fn until_up(&self) {
        let until = self.state.lock().unwrap().down_until;
        if let Some(t) = until {
            tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await;
        }
    }

    /// Drops every relayed connection mid-stream and turns new ones away for `down`.
    pub fn cut(&self, down: Duration) {
        let mut s = self.state.lock().unwrap();
        s.down_until = Some(Instant::now() + down);
        for h in s.live.drain(..) {
            h.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.state.lock().unwrap().live.drain(..) {
            h.abort();
        }
    }
}
