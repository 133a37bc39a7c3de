//! The one cache policy of compiled lists (stop strings and stop regexes):
//! least recently used out first, bounded by a count *and* by the heap bytes
//! of what it holds, so a stream of distinct large lists from clients cannot
//! make the process keep more than the byte bound.

use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};

use lru::LruCache;
use rustc_hash::FxHasher;

/// Entries kept at most by each process-wide cache.
pub const CACHE_CAPACITY: usize = 1024;

/// Heap bytes kept at most by each process-wide cache (an entry larger than
/// this is still returned to its caller, but not kept).
pub const CACHE_MAX_BYTES: usize = 256 << 20;

/// What a cached value costs to keep.
pub(crate) trait HeapBytes {
    fn heap_bytes(&self) -> usize;
}

/// A count- and byte-bounded LRU map from a list's hash to its compiled
/// value; a hit is confirmed by the caller (a collision costs a recompile).
pub(crate) struct ByteLru<V> {
    entries: LruCache<u64, V>,
    bytes: usize,
    max_bytes: usize,
}

impl<V: HeapBytes + Clone> ByteLru<V> {
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> Self {
        ByteLru {
            entries: LruCache::new(NonZeroUsize::new(capacity).expect("nonzero capacity")),
            bytes: 0,
            max_bytes,
        }
    }

    /// The value under `key` if `same` confirms it.
    pub(crate) fn get(&mut self, key: u64, same: impl FnOnce(&V) -> bool) -> Option<V> {
        let hit = self.entries.get(&key)?;
        same(hit).then(|| hit.clone())
    }

    pub(crate) fn insert(&mut self, key: u64, value: V) {
        let size = value.heap_bytes();
        if size > self.max_bytes {
            return;
        }
        self.bytes += size;
        if let Some((_, old)) = self.entries.push(key, value) {
            self.bytes -= old.heap_bytes();
        }
        while self.bytes > self.max_bytes {
            match self.entries.pop_lru() {
                Some((_, old)) => self.bytes -= old.heap_bytes(),
                None => break,
            }
        }
    }

    /// Heap bytes held (as counted by [`HeapBytes`]).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Locks a cache, going on after a panic elsewhere left it poisoned (its
/// state is consistent between calls).
pub(crate) fn lock<V>(m: &Mutex<V>) -> MutexGuard<'_, V> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of a list of strings.
pub(crate) fn list_hash<S: AsRef<str>>(items: &[S]) -> u64 {
    let mut h = FxHasher::default();
    h.write_usize(items.len());
    for s in items {
        s.as_ref().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Blob(usize);
    impl HeapBytes for Blob {
        fn heap_bytes(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn bounded_by_bytes_and_count() {
        let mut c = ByteLru::new(3, 100);
        for k in 0..10 {
            c.insert(k, Blob(40));
            assert!(c.bytes() <= 100);
        }
        assert_eq!(c.len(), 2);
        c.insert(99, Blob(101));
        assert!(
            c.get(99, |_| true).is_none(),
            "larger than the bound: not kept"
        );
        for k in 20..30 {
            c.insert(k, Blob(1));
        }
        assert_eq!(c.len(), 3);
        assert!(c.get(29, |_| true).is_some());
        assert!(c.get(29, |_| false).is_none());
    }
}
