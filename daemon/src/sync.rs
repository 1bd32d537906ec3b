//! Locks that outlive a panic. A panic while a lock is held fails the call
//! that panicked; the data behind the lock is kept consistent by each
//! holder's own steps, so later calls take the lock as it is instead of
//! failing in turn (the standard library's poisoning would make one bug in
//! one call take down every later call).

use std::sync::{LockResult, PoisonError};

pub trait Recover<G> {
    /// The guard, poisoned or not.
    fn recover(self) -> G;
}

impl<G> Recover<G> for LockResult<G> {
    fn recover(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_lock_held_by_a_panicking_thread_is_taken_again() {
        let m = Arc::new(Mutex::new(1));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = held.lock().recover();
            panic!("a bug while holding the lock");
        })
        .join();
        assert!(m.is_poisoned());
        *m.lock().recover() += 1;
        assert_eq!(*m.lock().recover(), 2);
    }
}
