//! Which Services hold each address.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::net::IpAddr;

use crate::address::{Family, ip_to_u128, u128_to_ip};

use super::pool_state::family_index;
use super::request::ServiceKey;

/// The Services holding one address: almost always one.
#[derive(Clone, Debug)]
pub(crate) enum Holders {
    One(ServiceKey),
    Many(Vec<ServiceKey>),
}

impl Holders {
    pub(crate) fn as_slice(&self) -> &[ServiceKey] {
        match self {
            Holders::One(key) => std::slice::from_ref(key),
            Holders::Many(keys) => keys,
        }
    }

    pub(crate) fn push(&mut self, key: ServiceKey) {
        match self {
            Holders::One(first) => *self = Holders::Many(vec![first.clone(), key]),
            Holders::Many(keys) => keys.push(key),
        }
    }

    /// Removes a holder; returns true when none is left.
    pub(crate) fn remove(&mut self, key: &ServiceKey) -> bool {
        match self {
            Holders::One(only) => only == key,
            Holders::Many(keys) => {
                keys.retain(|k| k != key);
                if let [last] = keys.as_slice() {
                    *self = Holders::One(last.clone());
                    return false;
                }
                keys.is_empty()
            }
        }
    }
}

/// The holders of every held address, per family, ordered by address: addresses are mostly
/// taken in ascending order, so inserts stay at the right edge of the tree, in cache, where a
/// hash table would touch a random bucket.
#[derive(Clone, Debug, Default)]
pub(crate) struct HolderMap {
    by_family: [BTreeMap<u128, Holders>; 2],
}

impl HolderMap {
    pub(crate) fn get(&self, ip: IpAddr) -> Option<&Holders> {
        self.by_family[family_index(Family::of(ip))].get(&ip_to_u128(ip))
    }

    pub(crate) fn entry(&mut self, ip: IpAddr) -> Entry<'_, u128, Holders> {
        self.by_family[family_index(Family::of(ip))].entry(ip_to_u128(ip))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (IpAddr, &Holders)> {
        let [v4, v6] = &self.by_family;
        v4.iter()
            .map(|(&v, h)| (u128_to_ip(Family::V4, v), h))
            .chain(v6.iter().map(|(&v, h)| (u128_to_ip(Family::V6, v), h)))
    }
}
