//! Sets of integer addresses stored as disjoint inclusive intervals.
//!
//! The allocator keeps the free space of each pool and family in one [`IntervalSet`]. A pool
//! starts as one interval per address range, whatever its size (a /8 or a /64 costs one map
//! entry), and every allocation or release changes at most two entries. Memory therefore follows
//! the number of holes punched into the free space, never the size of the pool.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent inclusive intervals of `u128` values.
///
/// Intervals are keyed by their *last* value so that taking the lowest value of the first
/// interval only rewrites that entry's start in place, without rebalancing the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IntervalSet {
    /// last → first.
    by_last: BTreeMap<u128, u128>,
}

impl IntervalSet {
    /// An empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Number of stored intervals (the memory the set costs).
    pub(crate) fn interval_count(&self) -> usize {
        self.by_last.len()
    }

    /// Whether the set holds no value.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_last.is_empty()
    }

    /// The intervals as `(first, last)` in ascending order.
    #[cfg(test)]
    pub(crate) fn intervals(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.by_last.iter().map(|(&last, &first)| (first, last))
    }

    /// The interval holding `value`, as `(first, last)`.
    fn interval_of(&self, value: u128) -> Option<(u128, u128)> {
        self.by_last
            .range(value..)
            .next()
            .and_then(|(&last, &first)| (first <= value).then_some((first, last)))
    }

    /// Whether the set holds `value`.
    pub(crate) fn contains(&self, value: u128) -> bool {
        self.interval_of(value).is_some()
    }

    /// The first (lowest) interval as `(first, last)`.
    pub(crate) fn first(&self) -> Option<(u128, u128)> {
        self.by_last
            .first_key_value()
            .map(|(&last, &first)| (first, last))
    }

    /// Adds every value of `first..=last`, merging with overlapping and adjacent intervals.
    pub(crate) fn insert_range(&mut self, first: u128, last: u128) {
        debug_assert!(first <= last);
        let (mut lo, mut hi) = (first, last);
        // Every interval that overlaps or touches [first, last] ends at or after first - 1.
        let touching: Vec<(u128, u128)> = self
            .by_last
            .range(first.saturating_sub(1)..)
            .take_while(|&(_, &start)| start <= last.saturating_add(1))
            .map(|(&end, &start)| (start, end))
            .collect();
        for (start, end) in touching {
            self.by_last.remove(&end);
            lo = lo.min(start);
            hi = hi.max(end);
        }
        self.by_last.insert(hi, lo);
    }

    /// Adds one value; returns false when it was already there.
    pub(crate) fn insert(&mut self, value: u128) -> bool {
        if self.contains(value) {
            return false;
        }
        // Fast paths for the common cases: join the interval just above or just below.
        let below = value
            .checked_sub(1)
            .and_then(|v| self.interval_of(v))
            .filter(|&(_, last)| last + 1 == value);
        let above = value
            .checked_add(1)
            .and_then(|v| self.interval_of(v))
            .filter(|&(first, _)| first == value + 1);
        match (below, above) {
            (Some((lo, below_last)), Some((_, hi))) => {
                self.by_last.remove(&below_last);
                self.by_last.insert(hi, lo);
            }
            (Some((lo, below_last)), None) => {
                self.by_last.remove(&below_last);
                self.by_last.insert(value, lo);
            }
            (None, Some((_, hi))) => {
                self.by_last.insert(hi, value);
            }
            (None, None) => {
                self.by_last.insert(value, value);
            }
        }
        true
    }

    /// Removes one value; returns false when it was not there.
    pub(crate) fn remove(&mut self, value: u128) -> bool {
        let Some((first, last)) = self.interval_of(value) else {
            return false;
        };
        if value == last {
            self.by_last.remove(&last);
            if first < value {
                self.by_last.insert(value - 1, first);
            }
        } else {
            // Keeps the entry keyed by `last`: only its start moves.
            self.by_last.insert(last, value + 1);
            if first < value {
                self.by_last.insert(value - 1, first);
            }
        }
        true
    }

    /// Removes every value of `first..=last`.
    pub(crate) fn remove_range(&mut self, first: u128, last: u128) {
        debug_assert!(first <= last);
        let overlapping: Vec<(u128, u128)> = self
            .by_last
            .range(first..)
            .take_while(|&(_, &start)| start <= last)
            .map(|(&end, &start)| (start, end))
            .collect();
        for (start, end) in overlapping {
            self.by_last.remove(&end);
            if start < first {
                self.by_last.insert(first - 1, start);
            }
            if end > last {
                self.by_last.insert(end, last + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn set(ranges: &[(u128, u128)]) -> IntervalSet {
        let mut s = IntervalSet::new();
        for &(a, b) in ranges {
            s.insert_range(a, b);
        }
        s
    }

    fn list(s: &IntervalSet) -> Vec<(u128, u128)> {
        s.intervals().collect()
    }

    #[test]
    fn insert_range_merges_overlapping_and_adjacent() {
        let s = set(&[(10, 20), (22, 30), (21, 21), (40, 50), (45, 60)]);
        assert_eq!(list(&s), [(10, 30), (40, 60)]);
    }

    #[test]
    fn remove_splits_and_insert_rejoins() {
        let mut s = set(&[(0, 9)]);
        assert!(s.remove(5));
        assert!(!s.remove(5));
        assert_eq!(list(&s), [(0, 4), (6, 9)]);
        assert!(s.remove(0) && s.remove(9));
        assert_eq!(list(&s), [(1, 4), (6, 8)]);
        assert!(s.insert(5));
        assert!(!s.insert(5));
        assert_eq!(list(&s), [(1, 8)]);
        assert!(s.insert(0) && s.insert(9));
        assert_eq!(list(&s), [(0, 9)]);
        assert_eq!(s.interval_count(), 1);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let mut s = set(&[(0, u128::MAX)]);
        assert!(s.remove(u128::MAX) && s.remove(0));
        assert_eq!(list(&s), [(1, u128::MAX - 1)]);
        assert!(s.insert(u128::MAX) && s.insert(0));
        assert_eq!(list(&s), [(0, u128::MAX)]);
        s.remove_range(0, u128::MAX);
        assert!(s.is_empty());
    }

    proptest::proptest! {
        /// The set holds exactly the values a plain set would, in as few intervals as possible.
        #[test]
        fn behaves_like_a_set_of_values(
            ops in proptest::collection::vec((0u8..4, 0u128..64, 0u128..8), 1..200),
        ) {
            let mut set = IntervalSet::new();
            let mut model = std::collections::BTreeSet::new();
            for (op, value, len) in ops {
                match op {
                    0 => proptest::prop_assert_eq!(set.insert(value), model.insert(value)),
                    1 => proptest::prop_assert_eq!(set.remove(value), model.remove(&value)),
                    2 => {
                        set.insert_range(value, value + len);
                        model.extend(value..=value + len);
                    }
                    _ => {
                        set.remove_range(value, value + len);
                        model.retain(|v| !(value..=value + len).contains(v));
                    }
                }
                let values: Vec<u128> = set.intervals().flat_map(|(a, b)| a..=b).collect();
                proptest::prop_assert_eq!(&values, &model.iter().copied().collect::<Vec<_>>());
                let runs = model.iter().zip(model.iter().skip(1)).filter(|(a, b)| **a + 1 != **b).count()
                    + usize::from(!model.is_empty());
                proptest::prop_assert_eq!(set.interval_count(), runs);
                proptest::prop_assert_eq!(set.first().map(|f| f.0), model.first().copied());
            }
        }
    }

    #[test]
    fn remove_range_cuts_across_intervals() {
        let mut s = set(&[(0, 10), (20, 30), (40, 50)]);
        s.remove_range(5, 45);
        assert_eq!(list(&s), [(0, 4), (46, 50)]);
        assert_eq!(s.first(), Some((0, 4)));
        assert!(s.contains(4) && !s.contains(5) && s.contains(46));
    }
}
