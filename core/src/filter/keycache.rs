//! Key caching (ARCHITECTURE.md §10): a key list a worker sent a server before goes as its digest,
//! and a pull's answer comes without the keys the worker asked for.
//!
//! A slice whose key list the server holds goes as `Message::PushCached` or `Message::PullCached`,
//! naming the list by its [`KeysDigest`], and the server answers a key-list pull with
//! `Message::PullValues`, the values alone: the worker has the list it asked for.
//!
//! A list is named by a 128-bit digest of its keys, not by a number either side hands out: the name
//! of a list is the same on every node, before and after any restart, so an entry a server kept can
//! only ever be the list the worker means. What can go wrong is that the server does not hold the
//! list (it evicted it, it restarted, the worker's first send of the list is still on its way): it
//! answers [`crate::wire::Message::KeysUnknown`], and the worker sends that slice again with the
//! whole list, and forgets that the server held it.
//!
//! Both sides keep at most [`KeyCaching::lists`] lists per peer, the least recently used leaving
//! first. Caches are equal by their lists and order of use, not by the use stamps that keep a use
//! cheap, so that the model checker sees one state per cache content. The worker counts the saving:
//! the bytes of the key lists it named instead of sending them, and those of the answers that came
//! without keys.
//!
//! The cluster model runs key caching (`ClusterModelConfig::key_caching`,
//! `pserver check --key-cache`), where a worker that names lists by a stale entry
//! (`Mutation::StaleKeyCache`) is caught; the simulator's oracle reads each named push as the keys
//! it names.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::filter::{FilterSaving, Tally};
use crate::ids::NodeId;
use crate::key::Key;

/// How many key lists each side of key caching keeps per peer: a worker the names of the
/// lists it sent each server, a server the lists each worker sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyCaching {
    lists: u32,
}

impl KeyCaching {
    /// Keeps `lists` lists per peer; `None` for zero.
    pub fn new(lists: u32) -> Option<Self> {
        (lists > 0).then_some(KeyCaching { lists })
    }

    /// Lists kept per peer.
    pub fn lists(self) -> u32 {
        self.lists
    }
}

impl Default for KeyCaching {
    /// 256 lists per peer: a worker's minibatches of about a hundred rows over a few servers
    /// make about that many lists per server and epoch on the shipped data.
    fn default() -> Self {
        KeyCaching { lists: 256 }
    }
}

/// The name of a key list: XXH3-128 of its keys' little-endian bytes. Two different lists
/// share a name with a probability of about 2^-128 per pair.
///
/// XXH3 rather than the ring's mixer (`crate::hash`): a name is computed over every key of
/// every list a worker sends and a server keeps, and the mixer, two rounds a key for each of
/// two lanes, took more time than the rest of key caching together (a tenth of a training
/// step on the shipped data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeysDigest(u128);

impl KeysDigest {
    /// The name of `keys`.
    pub fn of(keys: &[Key]) -> Self {
        // Little-endian on every machine, so that nodes of either byte order agree.
        let name = if cfg!(target_endian = "little") {
            xxhash_rust::xxh3::xxh3_128(bytemuck::cast_slice(keys))
        } else {
            let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            xxhash_rust::xxh3::xxh3_128(&bytes)
        };
        KeysDigest(name)
    }
}

/// Bytes an LEB128 varint of `x` takes.
fn varint_len(x: u128) -> usize {
    (128 - x.leading_zeros() as usize).div_ceil(7).max(1)
}

/// Bytes `keys` take on the wire, delta-encoded (`crate::forms`).
pub(crate) fn list_bytes(keys: &[Key]) -> usize {
    let Some((&first, rest)) = keys.split_first() else {
        return 0;
    };
    let mut prev = first;
    let mut bytes = varint_len(u128::from(first));
    for &k in rest {
        bytes += varint_len(u128::from(k - prev - 1));
        prev = k;
    }
    bytes
}

/// A bounded map from list names to `T`, the least recently used leaving first: each entry is
/// stamped with a use counter, in ordered maps, so that a use costs a logarithm of the size.
/// Two caches holding the same lists in the same order of use are equal whatever their
/// stamps (the equality and hash below go by that order): stamps compared as they are would
/// make every use a new state for the model checker, and its search endless.
#[derive(Clone, Debug)]
struct Recent<T> {
    uses: u64,
    by_name: BTreeMap<KeysDigest, (u64, T)>,
    by_use: BTreeMap<u64, KeysDigest>,
}

impl<T: PartialEq> PartialEq for Recent<T> {
    fn eq(&self, other: &Self) -> bool {
        self.by_use.len() == other.by_use.len()
            && self.in_order().zip(other.in_order()).all(|(a, b)| a == b)
    }
}

impl<T: Eq> Eq for Recent<T> {}

impl<T: Hash> Hash for Recent<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.by_use.len().hash(state);
        for entry in self.in_order() {
            entry.hash(state);
        }
    }
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Recent {
            uses: 0,
            by_name: BTreeMap::new(),
            by_use: BTreeMap::new(),
        }
    }
}

impl<T> Recent<T> {
    /// The entries, least recently used first.
    fn in_order(&self) -> impl Iterator<Item = (&KeysDigest, Option<&T>)> {
        self.by_use
            .values()
            .map(|name| (name, self.by_name.get(name).map(|(_, v)| v)))
    }

    fn touch(&mut self, name: KeysDigest) -> Option<&T> {
        self.uses += 1;
        let entry = self.by_name.get_mut(&name)?;
        self.by_use.remove(&entry.0);
        entry.0 = self.uses;
        self.by_use.insert(self.uses, name);
        Some(&entry.1)
    }

    /// The entry named `name`, its use not recorded.
    fn get(&self, name: KeysDigest) -> Option<&T> {
        self.by_name.get(&name).map(|(_, v)| v)
    }

    fn insert(&mut self, name: KeysDigest, value: T, most: usize) {
        self.remove(name);
        self.uses += 1;
        self.by_use.insert(self.uses, name);
        self.by_name.insert(name, (self.uses, value));
        while self.by_name.len() > most {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            self.by_name.remove(&oldest);
        }
    }

    fn remove(&mut self, name: KeysDigest) {
        if let Some((used, _)) = self.by_name.remove(&name) {
            self.by_use.remove(&used);
        }
    }

    /// The name used last.
    #[cfg(feature = "mutations")]
    fn newest(&self) -> Option<KeysDigest> {
        self.by_use.last_key_value().map(|(_, &name)| name)
    }
}

/// A worker's side: the names of the lists it sent each server in full, with the bytes each
/// took, and what naming them saved.
///
/// The bytes are kept rather than counted again at every use: counting them walks the list,
/// and took a third of key caching's time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SentLists {
    spec: KeyCaching,
    peers: BTreeMap<NodeId, Recent<u32>>,
    saving: Tally,
}

impl SentLists {
    pub(crate) fn new(spec: KeyCaching) -> Self {
        SentLists {
            spec,
            peers: BTreeMap::new(),
            saving: Tally::default(),
        }
    }

    /// How to send `keys` to `server`: `Some(name)` when the server was sent the list before
    /// (and has not said it lost it since); `None` to send it whole, which this records.
    ///
    /// `stale` is the `stale-key-cache` mutation: any list goes by the name of the one used
    /// last, as a cache that keeps one entry per peer and checks only that it holds one would.
    pub(crate) fn name_for(
        &mut self,
        server: NodeId,
        keys: &[Key],
        stale: bool,
    ) -> Option<KeysDigest> {
        let name = KeysDigest::of(keys);
        let peer = self.peers.entry(server).or_default();
        #[cfg(feature = "mutations")]
        if stale && let Some(last) = peer.newest() {
            return Some(last);
        }
        #[cfg(not(feature = "mutations"))]
        let _ = stale;
        let rows = keys.len() as u64;
        self.saving.0.rows_in += rows;
        if let Some(&bytes) = peer.touch(name) {
            let bytes = (bytes as usize).saturating_sub(varint_len(name.0));
            self.saving.0.bytes_saved += bytes as u64;
            Some(name)
        } else {
            let bytes = u32::try_from(list_bytes(keys)).unwrap_or(u32::MAX);
            peer.insert(name, bytes, self.spec.lists as usize);
            self.saving.0.rows_out += rows;
            None
        }
    }

    /// `server` does not hold the list named `name`: it goes whole the next time.
    pub(crate) fn forget(&mut self, server: NodeId, name: KeysDigest) {
        if let Some(peer) = self.peers.get_mut(&server) {
            peer.remove(name);
        }
    }

    /// An answer from `server` came without the `keys` it answers.
    pub(crate) fn answered_without(&mut self, server: NodeId, keys: &[Key]) {
        // The pull just named the list or sent it whole, so the list's bytes are kept,
        // unless the server said since that it lost the list.
        let kept = self
            .peers
            .get(&server)
            .and_then(|peer| peer.get(KeysDigest::of(keys)));
        let bytes = match kept {
            Some(&bytes) => bytes as usize,
            None => list_bytes(keys),
        };
        self.saving.0.bytes_saved += bytes as u64;
    }

    pub(crate) fn saving(&self) -> FilterSaving {
        self.saving.0
    }
}

/// A server's side: the lists each worker sent it whole, by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HeldLists {
    spec: KeyCaching,
    peers: BTreeMap<NodeId, Recent<Arc<Vec<Key>>>>,
}

impl HeldLists {
    pub(crate) fn new(spec: KeyCaching) -> Self {
        HeldLists {
            spec,
            peers: BTreeMap::new(),
        }
    }

    /// Keeps `keys`, as `worker` sent them whole.
    pub(crate) fn keep(&mut self, worker: NodeId, keys: Arc<Vec<Key>>) {
        let name = KeysDigest::of(&keys);
        self.peers
            .entry(worker)
            .or_default()
            .insert(name, keys, self.spec.lists as usize);
    }

    /// The list `worker` named `name`, if this server holds it.
    pub(crate) fn get(&mut self, worker: NodeId, name: KeysDigest) -> Option<Arc<Vec<Key>>> {
        self.peers.get_mut(&worker)?.touch(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_named_by_its_keys_alone() {
        assert_eq!(KeysDigest::of(&[1, 5, 9]), KeysDigest::of(&[1, 5, 9]));
        assert_ne!(KeysDigest::of(&[1, 5, 9]), KeysDigest::of(&[1, 5, 10]));
        assert_ne!(KeysDigest::of(&[]), KeysDigest::of(&[0]));
        assert_ne!(KeysDigest::of(&[0, 1]), KeysDigest::of(&[1, 0]));
    }

    #[test]
    fn list_bytes_counts_the_delta_varints() {
        assert_eq!(list_bytes(&[]), 0);
        assert_eq!(list_bytes(&[5]), 1);
        // 200 takes two bytes; the gaps 0 and 126 one each.
        assert_eq!(list_bytes(&[200, 201, 328]), 4);
    }

    #[test]
    fn a_worker_names_a_list_it_sent_and_sends_whole_what_the_server_lost() {
        let s = NodeId(1);
        let mut sent = SentLists::new(KeyCaching::new(2).unwrap());
        assert_eq!(sent.name_for(s, &[1, 2], false), None);
        let name = sent.name_for(s, &[1, 2], false);
        assert_eq!(name, Some(KeysDigest::of(&[1, 2])));
        // Another server was never sent it.
        assert_eq!(sent.name_for(NodeId(2), &[1, 2], false), None);
        sent.forget(s, KeysDigest::of(&[1, 2]));
        assert_eq!(sent.name_for(s, &[1, 2], false), None);
        let saving = sent.saving();
        assert_eq!((saving.rows_in, saving.rows_out), (8, 6));
    }

    #[test]
    fn each_side_keeps_the_lists_used_last() {
        let (w, s) = (NodeId(3), NodeId(1));
        let spec = KeyCaching::new(2).unwrap();
        let mut sent = SentLists::new(spec);
        let mut held = HeldLists::new(spec);
        for keys in [vec![1], vec![2], vec![1], vec![3]] {
            if sent.name_for(s, &keys, false).is_none() {
                held.keep(w, Arc::new(keys.clone()));
            } else {
                assert!(held.get(w, KeysDigest::of(&keys)).is_some());
            }
        }
        // [2] was used least recently: both sides let it go, [1] and [3] stay.
        assert!(held.get(w, KeysDigest::of(&[2])).is_none());
        assert_eq!(sent.name_for(s, &[2], false), None);
        assert_eq!(held.get(w, KeysDigest::of(&[3])).as_deref(), Some(&vec![3]));
        // Another worker's lists are its own.
        assert!(held.get(NodeId(4), KeysDigest::of(&[3])).is_none());
    }

    #[test]
    fn caches_with_the_same_lists_in_the_same_order_are_equal_whatever_their_use_counts() {
        let (a, b) = (KeysDigest::of(&[1]), KeysDigest::of(&[2]));
        let mut one = Recent::default();
        one.insert(a, (), 2);
        one.insert(b, (), 2);
        let mut other = one.clone();
        // Used again and again, in the end in the same order.
        for _ in 0..3 {
            other.touch(a);
            other.touch(b);
        }
        assert_eq!(one, other);
        let hash = |r: &Recent<()>| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            r.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&one), hash(&other));
        other.touch(a);
        assert_ne!(one, other);
    }

    /// The setting reads back as given: the simulator and the CLI report it.
    #[test]
    fn key_caching_says_how_many_lists_it_keeps() {
        assert_eq!(KeyCaching::new(3).map(KeyCaching::lists), Some(3));
        assert_eq!(KeyCaching::default().lists(), 256);
        assert!(KeyCaching::new(0).is_none());
    }

    /// A list's size counts each gap less one, as the key list's wire form does: the savings
    /// key caching reports are what the wire would have carried.
    #[test]
    fn list_bytes_counts_each_gap_less_one() {
        // 0 takes one byte; the gap 127 one byte, where 128 would take two.
        assert_eq!(list_bytes(&[0, 128]), 2);
        // 200 takes two bytes, the gap 199 two.
        assert_eq!(list_bytes(&[200, 400]), 4);
        assert_eq!(list_bytes(&[0, 1, 2]), 3);
    }

    /// Caches holding the same lists in another order of use evict differently, so they are
    /// other states: unequal, and hashed apart, for the model checker.
    #[test]
    fn caches_with_the_lists_in_another_order_hash_apart() {
        let (a, b) = (KeysDigest::of(&[1]), KeysDigest::of(&[2]));
        let mut one = Recent::default();
        one.insert(a, (), 2);
        one.insert(b, (), 2);
        let mut other = one.clone();
        other.touch(a);
        let hash = |r: &Recent<()>| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            r.hash(&mut h);
            h.finish()
        };
        assert_ne!(one, other);
        assert_ne!(hash(&one), hash(&other));
    }

    /// Naming a list saves its bytes less the name's, and an answer without its keys saves the
    /// list's bytes. The other tests' lists are shorter than a name and save nothing.
    #[test]
    fn naming_a_long_list_saves_its_bytes_less_the_names() {
        let s = NodeId(1);
        let keys: Vec<Key> = (0..100).collect();
        let named = list_bytes(&keys) - varint_len(KeysDigest::of(&keys).0);
        assert!(named > 0);
        let mut sent = SentLists::new(KeyCaching::new(2).unwrap());
        assert_eq!(sent.name_for(s, &keys, false), None);
        assert_eq!(sent.saving().bytes_saved, 0);
        assert_eq!(sent.name_for(s, &keys, false), Some(KeysDigest::of(&keys)));
        assert_eq!(sent.saving().bytes_saved, named as u64);
        // An answer without keys saves the list's bytes, kept or counted again.
        sent.answered_without(s, &keys);
        assert_eq!(sent.saving().bytes_saved, (named + 100) as u64);
        sent.answered_without(NodeId(2), &keys[..10]);
        assert_eq!(sent.saving().bytes_saved, (named + 110) as u64);
    }

    /// The `stale-key-cache` mutation names any list by the one used last, which the model
    /// checker must catch; here the cache's own half of it.
    #[cfg(feature = "mutations")]
    #[test]
    fn a_stale_cache_names_any_list_by_the_one_used_last() {
        let s = NodeId(1);
        let mut sent = SentLists::new(KeyCaching::new(4).unwrap());
        // Nothing used yet: the list goes whole, and is the one used last.
        assert_eq!(sent.name_for(s, &[1, 2], true), None);
        assert_eq!(sent.name_for(s, &[3], true), Some(KeysDigest::of(&[1, 2])));
    }
}
