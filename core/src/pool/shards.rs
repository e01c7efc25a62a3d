//! A string-keyed hash map split into [`SHARDS`] maps by a hash of the key.
//!
//! A pool keeps every reservation of its retention window, hundreds of thousands in a
//! busy sale, and a `HashMap` grows by moving every entry at once: at half a million
//! reservations one insert takes a few hundred milliseconds, and every caller of the pool
//! waits behind it. Split, a growth moves one shard's entries, so the longest insert is a
//! sixty-fourth of that. Serialized as one map, so the shape on the wire does not change.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const SHARDS: usize = 64;

#[derive(Debug, Clone)]
pub struct Shards<V> {
    maps: Vec<HashMap<String, V>>,
}

impl<V> Default for Shards<V> {
    fn default() -> Self {
        Self { maps: (0..SHARDS).map(|_| HashMap::new()).collect() }
    }
}

/// The shard of `key`: a fixed hash, so the same key always lands in the same shard (keys
/// that all pick one shard only make it as large as the unsplit map would be; each shard's
/// own map still hashes with a random key).
fn shard(key: &str) -> usize {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    // The remainder is below SHARDS, so it fits a usize.
    usize::try_from(h.finish() % SHARDS as u64).unwrap_or(0)
}

impl<V> Shards<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.maps[shard(key)].get(key)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&String, &V)> {
        self.maps[shard(key)].get_key_value(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.maps[shard(key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.maps[shard(key)].contains_key(key)
    }

    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        self.maps[shard(&key)].insert(key, value)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        self.maps[shard(key)].remove(key)
    }

    /// Every entry, in no particular order (callers that answer with them sort).
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.maps.iter().flat_map(HashMap::iter)
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.maps.iter().flat_map(HashMap::keys)
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
    // Equal keys sit in equal shards, so shard by shard is entry by entry.
    fn eq(&self, other: &Self) -> bool {
        self.maps == other.maps
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
