//! Connections that have not (yet) made an authenticated request.
//!
//! Anyone who can reach the listener can open connections; before a client
//! has shown the token its connection is only worth a `/health` answer. So
//! at most [`UnauthConns::cap`] such connections are kept: when one more
//! arrives, the oldest unauthenticated connection is closed (eviction, so
//! an attacker holding idle connections can never lock the platform's
//! backend out — its new connection always gets in). A connection leaves
//! the set on its first authenticated request, and a `401` answer closes
//! its connection (`Connection: close`), so an unauthenticated client never
//! keeps one alive. hyper's header-read timeout bounds how long any
//! connection may sit idle waiting for a request head.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// Default number of unauthenticated connections kept at once.
pub const DEFAULT_CAP: usize = 256;

/// One registered connection: its number and the end that closes it.
type Entry = (u64, oneshot::Sender<()>);

pub struct UnauthConns {
    cap: usize,
    inner: Mutex<(u64, VecDeque<Entry>)>,
}

/// Resolves when the connection was evicted; never otherwise.
pub struct Eviction {
    rx: Option<oneshot::Receiver<()>>,
    evicted: bool,
}

impl Eviction {
    /// Waits for the eviction. It may be waited for again after a wait
    /// that was dropped, and resolves at once once evicted.
    pub async fn wait(&mut self) {
        if let Some(rx) = &mut self.rx {
            self.evicted = rx.await.is_ok();
            self.rx = None;
        }
        if !self.evicted {
            // Authenticated or closed: never evicted.
            std::future::pending::<()>().await;
        }
    }
}

impl UnauthConns {
    pub fn new(cap: usize) -> UnauthConns {
        UnauthConns {
            cap: cap.max(1),
            inner: Mutex::new((0, VecDeque::new())),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, VecDeque<Entry>)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection, evicting the oldest unauthenticated one
    /// when the cap is reached. Returns the connection's number, its
    /// eviction signal and how many were evicted to make room.
    pub fn register(&self) -> (u64, Eviction, usize) {
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        let mut evicted = 0;
        while g.1.len() >= self.cap {
            if let Some((_, old)) = g.1.pop_front() {
                let _ = old.send(());
                evicted += 1;
            }
        }
        g.0 += 1;
        let id = g.0;
        g.1.push_back((id, tx));
        (
            id,
            Eviction {
                rx: Some(rx),
                evicted: false,
            },
            evicted,
        )
    }

    /// The connection made an authenticated request (or closed): it no
    /// longer counts and is never evicted.
    pub fn forget(&self, id: u64) {
        let mut g = self.lock();
        if let Some(i) = g.1.iter().position(|(c, _)| *c == id) {
            g.1.remove(i);
        }
    }

    /// Number of unauthenticated connections held now.
    pub fn len(&self) -> usize {
        self.lock().1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_is_evicted_and_the_authenticated_never() {
        let c = UnauthConns::new(2);
        let (a, mut ea, _) = c.register();
        let (b, eb, _) = c.register();
        c.forget(b); // b authenticated
        let (_, mut ec, n) = c.register();
        assert_eq!((n, c.len()), (0, 2));
        let ms = std::time::Duration::from_millis;
        // A wait dropped before the eviction leaves the next wait
        // working.
        assert!(tokio::time::timeout(ms(20), ea.wait()).await.is_err());
        let (_, _ed, n) = c.register();
        assert_eq!(n, 1, "a, the oldest unauthenticated one, goes");
        tokio::time::timeout(ms(1000), ea.wait())
            .await
            .expect("a evicted");
        tokio::time::timeout(ms(1000), ea.wait())
            .await
            .expect("and stays evicted");
        async fn idle(e: &mut Eviction) -> bool {
            tokio::time::timeout(std::time::Duration::from_millis(50), e.wait())
                .await
                .is_err()
        }
        let mut eb = eb;
        assert!(
            idle(&mut eb).await,
            "an authenticated connection is never evicted"
        );
        assert!(idle(&mut eb).await, "not on a second wait either");
        assert!(idle(&mut ec).await);
        let _ = a;
    }
}
