//! The state stages' tests' store: the memory store behind a gate the test opens and
//! shuts, so that a test chooses when the store's answers come.

use stateplane_replication::{FlowBytes, Holder, Reply, Request};
use stateplane_stores::memory::{MemoryLink, MemoryStore};
use stateplane_stores::{LinkCounters, StoreLink, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A memory store whose answers wait while the gate is shut.
pub struct Gated {
    link: MemoryLink<FlowBytes>,
    open: Arc<AtomicBool>,
    /// Every request sent, for the tests to read.
    sent: Sent,
    /// Whether the link says it is connected (a test may say it is not).
    connected: Arc<AtomicBool>,
}

pub type Sent = Arc<Mutex<Vec<Request<FlowBytes, Value>>>>;

impl Gated {
    /// A link to `store`, its gate shut, the gate, and the requests it will send.
    pub fn on(store: &MemoryStore<FlowBytes>) -> (Gated, Arc<AtomicBool>, Sent) {
        let open = Arc::new(AtomicBool::new(false));
        let sent = Sent::default();
        let link = Gated {
            link: store.link(),
            open: Arc::clone(&open),
            sent: Arc::clone(&sent),
            connected: Arc::new(AtomicBool::new(true)),
        };
        (link, open, sent)
    }

    /// The flag the link's `connected` count follows.
    pub fn connection(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.connected)
    }
}

impl StoreLink<FlowBytes> for Gated {
    fn send(&mut self, holder: Holder, requests: &mut Vec<Request<FlowBytes, Value>>) {
        if let Ok(mut sent) = self.sent.lock() {
            sent.extend(requests.iter().cloned());
        }
        self.link.send(holder, requests);
    }
    fn receive(&mut self, out: &mut Vec<Reply<FlowBytes, Value>>) {
        if self.open.load(Ordering::Relaxed) {
            self.link.receive(out);
        }
    }
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn counters(&self) -> LinkCounters {
        LinkCounters {
            connected: u64::from(self.connected.load(Ordering::Relaxed)),
            ..self.link.counters()
        }
    }
}
