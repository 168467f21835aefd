//! The server-side assignors of the consumer protocol: `uniform` (the default) and `range`. An assignor
//! maps each member to the partitions it should own, given what every member subscribes to and, for
//! stickiness, the assignment it had before. It does no I/O and keeps no state.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::{Assignment, TopicId};

/// A server-side assignor, by the name a member asks for in `group.remote.assignor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    /// Spreads every subscribed partition evenly over the members that subscribe to its topic, moving as
    /// few partitions as it can from one assignment to the next.
    Uniform,
    /// Per topic, the members subscribed to it in member-id order take consecutive ranges of its
    /// partitions, so members subscribed to topics of equal partition counts get the same partition
    /// numbers of each (co-partitioning).
    Range,
}

impl Assignor {
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Uniform => "uniform",
            Assignor::Range => "range",
        }
    }

    /// The assignors a broker offers, from `group.consumer.assignors` (names separated by commas, the
    /// first the default).
    pub fn list(names: &str) -> Result<&'static [Assignor], String> {
        let names: Vec<&str> = names.split(',').map(str::trim).collect();
        for name in &names {
            if Assignor::from_name(name).is_none() {
                return Err(format!("unknown assignor `{name}` (uniform, range)"));
            }
        }
        match names[..] {
            ["uniform"] => Ok(&[Assignor::Uniform]),
            ["range"] => Ok(&[Assignor::Range]),
            ["uniform", "range"] => Ok(&[Assignor::Uniform, Assignor::Range]),
            ["range", "uniform"] => Ok(&[Assignor::Range, Assignor::Uniform]),
            _ => Err("each assignor at most once".to_string()),
        }
    }

    pub fn from_name(name: &str) -> Option<Assignor> {
        match name {
            "uniform" => Some(Assignor::Uniform),
            "range" => Some(Assignor::Range),
            _ => None,
        }
    }

    /// Every member's assignment, for each member in `members` (an empty one for a member that gets
    /// nothing). `partitions` gives each topic's partition count; subscribed topics missing from it are
    /// skipped (they do not exist, or not yet).
    pub fn assign(
        self,
        members: &BTreeMap<String, AssignmentSpec>,
        partitions: &BTreeMap<TopicId, i32>,
    ) -> BTreeMap<String, Assignment> {
        match self {
            Assignor::Uniform => uniform(members, partitions),
            Assignor::Range => range(members, partitions),
        }
    }
}

/// What an assignor knows of one member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignmentSpec {
    /// The topics it subscribes to.
    pub subscribed: BTreeSet<TopicId>,
    /// Its assignment in the previous target (for stickiness).
    pub previous: Assignment,
}

/// Subscribers of each existing topic, in member-id order.
fn subscribers<'a>(
    members: &'a BTreeMap<String, AssignmentSpec>,
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<TopicId, Vec<&'a str>> {
    let mut by_topic: BTreeMap<TopicId, Vec<&str>> = BTreeMap::new();
    for (id, spec) in members {
        for topic in spec.subscribed.iter().filter(|t| partitions.get(t).is_some_and(|&n| n > 0)) {
            by_topic.entry(*topic).or_default().push(id);
        }
    }
    by_topic
}

fn empty_assignments(members: &BTreeMap<String, AssignmentSpec>) -> BTreeMap<String, Assignment> {
    members.keys().map(|id| (id.clone(), Assignment::new())).collect()
}

fn range(
    members: &BTreeMap<String, AssignmentSpec>,
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out = empty_assignments(members);
    for (topic, subscribed) in subscribers(members, partitions) {
        let count = partitions[&topic];
        let each = count / subscribed.len() as i32;
        let extra = count % subscribed.len() as i32;
        let mut next = 0;
        for (i, member) in subscribed.iter().enumerate() {
            let take = each + i32::from((i as i32) < extra);
            if take > 0 {
                out.get_mut(*member).expect("a member").insert(topic, (next..next + take).collect());
            }
            next += take;
        }
    }
    out
}

/// Uniform: each member first keeps what it had that it still subscribes to; partitions nobody keeps go
/// one by one to the subscriber holding the fewest; then partitions move, one at a time, from the member
/// holding the most to a subscriber holding two or more fewer. Each move lowers the sum of the squared
/// counts, so this ends; with equal subscriptions it ends with counts at most one apart, and only members
/// above their share give up partitions.
fn uniform(
    members: &BTreeMap<String, AssignmentSpec>,
    partitions: &BTreeMap<TopicId, i32>,
) -> BTreeMap<String, Assignment> {
    // Members by index (in id order), so that counts are a vector: the least-holding subscriber of a
    // topic is looked for once per partition placed or moved.
    let specs: Vec<&AssignmentSpec> = members.values().collect();
    let mut held: Vec<Assignment> = vec![Assignment::new(); specs.len()];
    let mut count: Vec<usize> = vec![0; specs.len()];
    let mut by_topic: BTreeMap<TopicId, Vec<usize>> = BTreeMap::new();
    for (i, spec) in specs.iter().enumerate() {
        for topic in spec.subscribed.iter().filter(|t| partitions.get(t).is_some_and(|&n| n > 0)) {
            by_topic.entry(*topic).or_default().push(i);
        }
    }
    // The first (lowest id) of the subscribers holding the fewest.
    let least = |subscribed: &[usize], count: &[usize]| {
        *subscribed.iter().min_by_key(|m| count[**m]).expect("a topic with subscribers")
    };

    let mut taken: HashSet<(TopicId, i32)> = HashSet::new();
    for (i, spec) in specs.iter().enumerate() {
        for (topic, kept) in &spec.previous {
            let Some(&n) = partitions.get(topic) else { continue };
            if !spec.subscribed.contains(topic) {
                continue;
            }
            for &p in kept.iter().filter(|&&p| (0..n).contains(&p)) {
                if taken.insert((*topic, p)) {
                    held[i].entry(*topic).or_default().insert(p);
                    count[i] += 1;
                }
            }
        }
    }

    for (topic, subscribed) in &by_topic {
        for p in (0..partitions[topic]).filter(|p| !taken.contains(&(*topic, *p))) {
            let to = least(subscribed, &count);
            held[to].entry(*topic).or_default().insert(p);
            count[to] += 1;
        }
    }

    // The member holding the most gives one partition to the least-holding subscriber of its topic, if
    // that one holds two or more fewer; again until no such pair is left. Members by count, most first.
    let mut by_count: BTreeSet<(Reverse<usize>, usize)> =
        count.iter().enumerate().map(|(i, c)| (Reverse(*c), i)).collect();
    'balance: loop {
        let fewest = by_count.last().map_or(0, |(Reverse(c), _)| *c);
        for &(Reverse(most), from) in &by_count {
            if most <= fewest + 1 {
                break;
            }
            let found = held[from].keys().find_map(|topic| {
                let to = least(&by_topic[topic], &count);
                (count[to] + 1 < most).then_some((*topic, to))
            });
            if let Some((topic, to)) = found {
                let from_topic = held[from].get_mut(&topic).expect("held");
                let p = from_topic.pop_first().expect("a topic held has partitions");
                if from_topic.is_empty() {
                    held[from].remove(&topic);
                }
                held[to].entry(topic).or_default().insert(p);
                for (member, delta) in [(from, -1isize), (to, 1)] {
                    by_count.remove(&(Reverse(count[member]), member));
                    count[member] = count[member].checked_add_signed(delta).expect("counts stay positive");
                    by_count.insert((Reverse(count[member]), member));
                }
                continue 'balance;
            }
        }
        return members.keys().cloned().zip(held).collect();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use uuid::Uuid;

    use super::*;

    fn topic(n: u8) -> TopicId {
        Uuid::from_u128(n as u128 + 1)
    }

    fn spec(topics: &[u8]) -> AssignmentSpec {
        AssignmentSpec { subscribed: topics.iter().map(|t| topic(*t)).collect(), previous: Assignment::new() }
    }

    fn total(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn range_gives_each_member_the_same_numbers_of_co_partitioned_topics() {
        let members: BTreeMap<String, AssignmentSpec> =
            ["a", "b", "c"].iter().map(|m| (m.to_string(), spec(&[0, 1]))).collect();
        let partitions = BTreeMap::from([(topic(0), 7), (topic(1), 7)]);
        let out = Assignor::Range.assign(&members, &partitions);
        assert_eq!(out["a"][&topic(0)], (0..3).collect());
        assert_eq!(out["b"][&topic(0)], (3..5).collect());
        assert_eq!(out["c"][&topic(0)], (5..7).collect());
        for m in ["a", "b", "c"] {
            assert_eq!(out[m][&topic(0)], out[m][&topic(1)], "{m} has the same numbers of both topics");
        }
    }

    #[test]
    fn uniform_moves_only_what_a_new_member_needs() {
        let mut members: BTreeMap<String, AssignmentSpec> =
            ["a", "b"].iter().map(|m| (m.to_string(), spec(&[0]))).collect();
        let partitions = BTreeMap::from([(topic(0), 12)]);
        let first = Assignor::Uniform.assign(&members, &partitions);
        assert_eq!(total(&first["a"]), 6);
        assert_eq!(total(&first["b"]), 6);
        for (m, a) in &first {
            members.get_mut(m).unwrap().previous = a.clone();
        }
        members.insert("c".into(), spec(&[0]));
        let second = Assignor::Uniform.assign(&members, &partitions);
        for m in ["a", "b", "c"] {
            assert_eq!(total(&second[m]), 4, "{m}: {second:?}");
        }
        for m in ["a", "b"] {
            let kept = &second[m][&topic(0)];
            assert!(kept.is_subset(&first[m][&topic(0)]), "{m} keeps 4 of its own 6, gains none");
        }
    }

    #[test]
    fn a_topic_nobody_subscribes_to_or_that_does_not_exist_is_not_assigned() {
        let members = BTreeMap::from([("a".to_string(), spec(&[0, 5]))]);
        let partitions = BTreeMap::from([(topic(0), 2), (topic(1), 3)]);
        for assignor in [Assignor::Uniform, Assignor::Range] {
            let out = assignor.assign(&members, &partitions);
            assert_eq!(out["a"], Assignment::from([(topic(0), BTreeSet::from([0, 1]))]), "{assignor:?}");
        }
    }

    fn members_strategy() -> impl Strategy<Value = (BTreeMap<String, AssignmentSpec>, BTreeMap<TopicId, i32>)> {
        let topics = proptest::collection::vec(0..20i32, 1..5);
        let members = proptest::collection::vec(
            (proptest::collection::btree_set(0u8..5, 0..4), proptest::collection::vec((0u8..5, 0..20i32), 0..20)),
            0..8,
        );
        (topics, members).prop_map(|(counts, members)| {
            let partitions: BTreeMap<TopicId, i32> =
                counts.iter().enumerate().map(|(i, n)| (topic(i as u8), *n)).collect();
            let members = members
                .into_iter()
                .enumerate()
                .map(|(i, (subscribed, previous))| {
                    let mut prev = Assignment::new();
                    for (t, p) in previous {
                        prev.entry(topic(t)).or_default().insert(p);
                    }
                    (
                        format!("m{i}"),
                        AssignmentSpec { subscribed: subscribed.into_iter().map(topic).collect(), previous: prev },
                    )
                })
                .collect();
            (members, partitions)
        })
    }

    proptest! {
        /// Both assignors give every partition of a subscribed topic to exactly one subscriber of it, and
        /// nothing else. With equal subscriptions, uniform's counts are at most one apart.
        #[test]
        fn every_subscribed_partition_goes_to_one_subscriber((members, partitions) in members_strategy()) {
            for assignor in [Assignor::Uniform, Assignor::Range] {
                let out = assignor.assign(&members, &partitions);
                prop_assert_eq!(out.len(), members.len());
                let mut owner: BTreeMap<(TopicId, i32), &str> = BTreeMap::new();
                for (m, a) in &out {
                    for (t, ps) in a {
                        prop_assert!(members[m].subscribed.contains(t), "{} got unsubscribed topic", m);
                        prop_assert!(!ps.is_empty());
                        for p in ps {
                            prop_assert!(*p >= 0 && *p < partitions[t]);
                            prop_assert!(owner.insert((*t, *p), m).is_none(), "{:?} has two owners", (t, p));
                        }
                    }
                }
                for (t, n) in &partitions {
                    let subscribed = members.values().any(|s| s.subscribed.contains(t));
                    for p in 0..*n {
                        prop_assert_eq!(owner.contains_key(&(*t, p)), subscribed, "{:?} {}", t, p);
                    }
                }
                let equal = members.values().all(|s| Some(&s.subscribed) == members.values().next().map(|f| &f.subscribed));
                if assignor == Assignor::Uniform && equal {
                    let counts: Vec<usize> = out.values().map(total).collect();
                    let (lo, hi) = (counts.iter().min(), counts.iter().max());
                    if let (Some(lo), Some(hi)) = (lo, hi) {
                        prop_assert!(hi - lo <= 1, "{:?}", counts);
                    }
                }
            }
        }
    }
}
