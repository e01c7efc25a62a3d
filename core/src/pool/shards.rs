//! A string-keyed hash map split into [`SHARDS`] tables by a hash of the key.
//!
//! A pool keeps every reservation of its retention window, hundreds of thousands in a
//! busy sale, and a hash table grows by moving every entry at once: at half a million
//! reservations one insert takes a few hundred milliseconds, and every caller of the pool
//! waits behind it. Split, a growth moves one shard's entries, so the longest insert is a
//! sixty-fourth of that. Serialized as one map, so the shape on the wire does not change.
//!
//! A key is hashed once per call (a randomly keyed SipHash, as `HashMap`'s): the shard is
//! picked from bits of that hash the table itself does not use, and each entry keeps its
//! hash, so a growth moves entries without reading their keys again.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const SHARDS: usize = 64;

#[derive(Debug, Clone)]
struct Entry<V> {
    hash: u64,
    key: String,
    value: V,
}

#[derive(Debug, Clone)]
pub struct Shards<V> {
    hasher: RandomState,
    maps: Vec<HashTable<Entry<V>>>,
}

impl<V> Default for Shards<V> {
    fn default() -> Self {
        Self { hasher: RandomState::new(), maps: (0..SHARDS).map(|_| HashTable::new()).collect() }
    }
}

/// The shard of a key hashed to `hash`: bits 32 to 37. A table places an entry by the low
/// bits of its hash and tags it with the top seven, so the entries of one shard still
/// differ in both (a table would need 2^32 buckets to reach these bits).
fn shard(hash: u64) -> usize {
    // Masked to below SHARDS, so it fits a usize.
    usize::try_from((hash >> 32) % SHARDS as u64).unwrap_or(0)
}

impl<V> Shards<V> {
    fn find(&self, key: &str) -> Option<&Entry<V>> {
        let hash = self.hasher.hash_one(key);
        self.maps[shard(hash)].find(hash, |e| e.key == key)
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.find(key).map(|e| &e.value)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&String, &V)> {
        self.find(key).map(|e| (&e.key, &e.value))
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let hash = self.hasher.hash_one(key);
        self.maps[shard(hash)].find_mut(hash, |e| e.key == key).map(|e| &mut e.value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        let hash = self.hasher.hash_one(key.as_str());
        match self.maps[shard(hash)].entry(hash, |e| e.key == key, |e| e.hash) {
            Slot::Occupied(mut held) => Some(std::mem::replace(&mut held.get_mut().value, value)),
            Slot::Vacant(free) => {
                free.insert(Entry { hash, key, value });
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let hash = self.hasher.hash_one(key);
        match self.maps[shard(hash)].find_entry(hash, |e| e.key == key) {
            Ok(held) => Some(held.remove().0.value),
            Err(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        self.maps.iter().map(HashTable::len).sum()
    }

    /// Every entry, in no particular order (callers that answer with them sort).
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.maps.iter().flat_map(HashTable::iter).map(|e| (&e.key, &e.value))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.iter().map(|(k, _)| k)
    }
}

impl<V> FromIterator<(String, V)> for Shards<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(entries: I) -> Self {
        let mut shards = Self::default();
        for (k, v) in entries {
            shards.insert(k, v);
        }
        shards
    }
}

impl<V: PartialEq> PartialEq for Shards<V> {
    // Each map hashes with keys of its own: entry by entry.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<V: Eq> Eq for Shards<V> {}

impl<V: Serialize> Serialize for Shards<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Shards<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(HashMap::<String, V>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_one_map_and_serializes_as_one() {
        let mut plain = HashMap::new();
        let mut shards = Shards::default();
        for i in 0..1_000u64 {
            let key = format!("key-{i}");
            assert_eq!(shards.insert(key.clone(), i), plain.insert(key, i));
        }
        assert_eq!(shards.insert("key-7".into(), 70), Some(7));
        plain.insert("key-7".into(), 70);
        for i in (0..1_000).step_by(3) {
            let key = format!("key-{i}");
            assert_eq!(shards.remove(&key), plain.remove(&key));
        }
        assert_eq!(shards.remove("absent"), None);
        *shards.get_mut("key-8").unwrap() += 1;
        *plain.get_mut("key-8").unwrap() += 1;
        assert_eq!(shards.iter().count(), plain.len());
        for (k, v) in &plain {
            assert_eq!(shards.get(k), Some(v));
            assert!(shards.contains_key(k));
            assert_eq!(shards.get_key_value(k), Some((k, v)));
        }
        let mut from_shards: Vec<(&String, &u64)> = shards.iter().collect();
        let mut from_plain: Vec<(&String, &u64)> = plain.iter().collect();
        from_shards.sort();
        from_plain.sort();
        assert_eq!(from_shards, from_plain);
        assert_eq!(shards.keys().count(), plain.len());
        // The keys spread over the shards.
        assert!(shards.maps.iter().filter(|m| !m.is_empty()).count() > SHARDS / 2);

        let json = serde_json::to_string(&shards).unwrap();
        let as_map: HashMap<String, u64> = serde_json::from_str(&json).unwrap();
        assert_eq!(as_map, plain);
        let back: Shards<u64> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, shards);
        let mut other = back.clone();
        other.insert("key-1".into(), 0);
        assert_ne!(other, shards);
    }
}
