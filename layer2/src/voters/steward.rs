//! The controller's side of the voter configuration (decision 0023, *Changing the voters*):
//! which nodes are voters, when to change them, and when a change may end.
//!
//! The controller's leader calls [`Steward::plan`] with the published configuration and the
//! nodes, and carries out the one [`Plan`] it returns:
//!
//! * **Choice.** The first configuration takes [`spread`] over the eligible nodes (Ready, with a
//!   live speaker). Later ones keep every current voter that is still eligible and fill up,
//!   one at a time, from the failure domain with the fewest voters (then by domain and node
//!   name): a change replaces what failed and moves nothing else.
//! * **When.** A change starts once the wanted set has differed from the current one for
//!   [`Settings::replace_after`]: a voter that is gone that long, or room for more voters that
//!   long (a cluster that grew). A restart or a short partition changes nothing.
//! * **The joint phase ends** ([`VoterConfig::finish`]) once every voter of both sets has left
//!   the previous generation, each known from a fresh read of its duty record ([`Steward::read`]):
//!   its [`Mark`] says it read the joint generation and serves it or later (or nothing), or it
//!   has written nothing for [`super::Timers::confirm_within`] plus [`Settings::margin`] across
//!   two reads and the controller has fenced it ([`Plan::Fence`], [`Steward::fenced`]): a voter
//!   that cannot write its mark cannot confirm, so it has stopped reporting. Then the drain
//!   ([`super::Timers::drain`]) passes, and the change ends.
//! * **A joint phase that cannot end** because a voter of `next` is gone for
//!   [`Settings::replace_after`] is replaced by another joint phase with the same `current`
//!   (any two configurations that share a set are safe together).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::duty::Mark;
use super::{ConfigError, MAX_VOTERS, Timers, VoterConfig, spread};

/// The controller's settings for the voters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How many voters to aim for (rounded down to an odd number, at most [`MAX_VOTERS`]).
    pub count: usize,
    /// How long the wanted voters must differ from the current ones before a change starts.
    pub replace_after: Duration,
    /// The speakers' timers (the confirmation window and the drain).
    pub timers: Timers,
    /// Added to the confirmation window before a quiet voter is fenced: clock rates differ.
    pub margin: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            count: 5,
            replace_after: Duration::from_secs(30),
            timers: Timers::default(),
            margin: Duration::from_secs(1),
        }
    }
}

/// A node as the controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The Node's name.
    pub name: String,
    /// Its failure domain (zone, rack), empty when unknown.
    pub domain: String,
    /// Whether it may be a voter now: Ready, and its speaker alive.
    pub eligible: bool,
}

/// Why a configuration is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// There was none.
    First,
    /// The wanted voters differ from the current ones: a change starts.
    Change,
    /// A joint phase whose new voters cannot all serve is replaced by another.
    Replace,
    /// Every voter has left the previous generation and the drain has passed.
    Finish,
}

/// The controller's next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing to do now.
    Idle,
    /// Publish this configuration (fenced like every controller write).
    Publish(VoterConfig, Why),
    /// Read these voters' duty records afresh (quorum reads) and hand each to
    /// [`Steward::read`].
    Read(Vec<String>),
    /// Fence this voter: write its duty record's fence (`generation`) on `version` (`None`:
    /// create the record, which must not exist), and report success with [`Steward::fenced`].
    Fence {
        /// The voter.
        voter: String,
        /// The record's version read twice (`None`: there was no record).
        version: Option<String>,
        /// The fence: seats serving below it end.
        generation: u64,
    },
    /// Every voter has moved on: publish the end of the change at this instant.
    FinishAt(Instant),
}

/// A fresh read of one voter's duty record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DutyRead {
    /// The record's version (`resourceVersion`), `None` when there is no record.
    pub version: Option<String>,
    /// Its mark, if it has a valid one.
    pub mark: Option<Mark>,
    /// Its fence (0 when none).
    pub fence: u64,
    /// When the read was sent.
    pub started: Instant,
    /// When its answer came.
    pub done: Instant,
}

/// How far one voter of a joint phase is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Progress {
    /// Its record was quiet at `version` from `since` (the first such read's answer) on.
    Quiet {
        version: Option<String>,
        since: Instant,
    },
    /// Quiet long enough: to be fenced on `version`.
    ToFence(Option<String>),
    /// It serves the joint generation or later, has no seat, or is fenced.
    Moved,
}

/// The controller's memory between steps (it starts afresh in every term: what it lost it
/// reads again).
#[derive(Clone, Debug, Default)]
pub struct Steward {
    settings: Settings,
    /// Since when the wanted voters differ from the current ones, with the generation seen.
    differs_since: Option<(u64, Instant)>,
    /// The joint generation being ended, and each voter's progress.
    joint: Option<(u64, BTreeMap<String, Progress>)>,
    /// When every voter of the joint generation was seen moved on.
    moved_at: Option<Instant>,
    /// Before the first configuration: the eligible nodes last seen, and since when.
    first_seen: Option<(Vec<String>, Instant)>,
}

/// The longest the first configuration waits for the eligible nodes to stop changing.
const FIRST_SETTLE: Duration = Duration::from_secs(10);

impl Steward {
    /// A steward with `settings`.
    pub fn new(settings: Settings) -> Self {
        Steward {
            settings,
            ..Default::default()
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The next step at `now`, with `config` the published configuration (`None`: none yet)
    /// and `nodes` every Node.
    pub fn plan(
        &mut self,
        config: Option<&VoterConfig>,
        nodes: &[Candidate],
        now: Instant,
    ) -> Result<Plan, ConfigError> {
        let Some(config) = config else {
            let eligible: Vec<(String, String)> = nodes
                .iter()
                .filter(|n| n.eligible)
                .map(|n| (n.name.clone(), n.domain.clone()))
                .collect();
            let voters = spread(&eligible, self.target(eligible.len()));
            if voters.is_empty() {
                return Ok(Plan::Idle);
            }
            // At install the speakers come up one by one: unless the count is already
            // reached, wait until the eligible nodes stop changing, so the first voters are
            // not one node for a whole `replace_after`.
            let names: Vec<String> = eligible.into_iter().map(|(n, _)| n).collect();
            let settle = self.settings.replace_after.min(FIRST_SETTLE);
            if voters.len() < self.settings.count.clamp(1, MAX_VOTERS) {
                match &self.first_seen {
                    Some((seen, since)) if *seen == names => {
                        if now.saturating_duration_since(*since) < settle {
                            return Ok(Plan::Idle);
                        }
                    }
                    _ => {
                        self.first_seen = Some((names, now));
                        if !settle.is_zero() {
                            return Ok(Plan::Idle);
                        }
                    }
                }
            }
            return Ok(Plan::Publish(
                VoterConfig::new(1, voters, Vec::<String>::new())?,
                Why::First,
            ));
        };
        if config.joint() {
            return self.plan_joint(config, nodes, now);
        }
        self.joint = None;
        self.moved_at = None;
        let wanted = self.wanted(&config.current, nodes);
        if wanted == config.current || wanted.is_empty() {
            self.differs_since = None;
            return Ok(Plan::Idle);
        }
        if !self.due(config.generation, now) {
            return Ok(Plan::Idle);
        }
        self.differs_since = None;
        Ok(Plan::Publish(config.change_to(wanted)?, Why::Change))
    }

    fn plan_joint(
        &mut self,
        config: &VoterConfig,
        nodes: &[Candidate],
        now: Instant,
    ) -> Result<Plan, ConfigError> {
        let g = config.generation;
        // The new voters of a phase that cannot end are replaced, the old ones kept.
        let wanted = self.wanted(&config.next, nodes);
        if wanted != config.next && !wanted.is_empty() {
            if self.due(g, now) {
                self.differs_since = None;
                let replace = VoterConfig::new(g + 1, config.current.clone(), wanted)?;
                return Ok(Plan::Publish(replace, Why::Replace));
            }
        } else {
            self.differs_since = None;
        }
        if self.joint.as_ref().is_none_or(|(j, _)| *j != g) {
            self.joint = Some((g, BTreeMap::new()));
            self.moved_at = None;
        }
        if let Some(at) = self.moved_at {
            let due = at + self.settings.timers.drain();
            if now >= due {
                return Ok(config
                    .finish()
                    .map_or(Plan::Idle, |c| Plan::Publish(c, Why::Finish)));
            }
            return Ok(Plan::FinishAt(due));
        }
        let Some((_, progress)) = self.joint.as_ref() else {
            return Ok(Plan::Idle);
        };
        if let Some((voter, version)) = progress.iter().find_map(|(v, p)| match p {
            Progress::ToFence(version) => Some((v.clone(), version.clone())),
            _ => None,
        }) {
            return Ok(Plan::Fence {
                voter,
                version,
                generation: g,
            });
        }
        let unread: Vec<String> = config
            .voters()
            .filter(|v| !matches!(progress.get(*v), Some(Progress::Moved)))
            .map(str::to_string)
            .collect();
        if unread.is_empty() {
            self.moved_at = Some(now);
            return Ok(Plan::FinishAt(now + self.settings.timers.drain()));
        }
        Ok(Plan::Read(unread))
    }

    /// Takes in a fresh read of `voter`'s duty record during joint generation `generation`.
    pub fn read(&mut self, generation: u64, voter: &str, read: DutyRead) {
        let Some((g, progress)) = self.joint.as_mut() else {
            return;
        };
        if *g != generation {
            return;
        }
        let moved = read.fence >= generation
            || read
                .mark
                .is_some_and(|m| m.read >= generation && m.serves.is_none_or(|s| s >= generation));
        let quiet_for = self.settings.timers.confirm_within + self.settings.margin;
        let next = if moved {
            Progress::Moved
        } else {
            match progress.get(voter) {
                Some(Progress::Moved) => Progress::Moved,
                Some(Progress::Quiet { version, since })
                    if *version == read.version && read.started >= *since + quiet_for =>
                {
                    Progress::ToFence(read.version)
                }
                Some(Progress::Quiet { version, since }) if *version == read.version => {
                    Progress::Quiet {
                        version: read.version,
                        since: *since,
                    }
                }
                Some(Progress::ToFence(version)) if *version == read.version => {
                    Progress::ToFence(read.version)
                }
                _ => Progress::Quiet {
                    version: read.version,
                    since: read.done,
                },
            }
        };
        progress.insert(voter.to_string(), next);
    }

    /// The fence of `voter` for joint generation `generation` landed (`landed`), or was
    /// refused because the record changed (the voter wrote: it is read again).
    pub fn fenced(&mut self, generation: u64, voter: &str, landed: bool) {
        if let Some((g, progress)) = self.joint.as_mut()
            && *g == generation
        {
            if landed {
                progress.insert(voter.to_string(), Progress::Moved);
            } else {
                progress.remove(voter);
            }
        }
    }

    /// How many voters to aim for among `eligible` nodes: the setting, at most
    /// [`MAX_VOTERS`] and the eligible nodes, odd above 2.
    fn target(&self, eligible: usize) -> usize {
        let mut count = self.settings.count.clamp(1, MAX_VOTERS).min(eligible);
        if count > 2 && count.is_multiple_of(2) {
            count -= 1;
        }
        count
    }

    /// Whether the wanted voters have differed long enough, at generation `generation`.
    fn due(&mut self, generation: u64, now: Instant) -> bool {
        match self.differs_since {
            Some((g, since)) if g == generation => {
                now.saturating_duration_since(since) >= self.settings.replace_after
            }
            _ => {
                self.differs_since = Some((generation, now));
                self.settings.replace_after.is_zero()
            }
        }
    }

    /// The voters wanted from `voters`: the still eligible ones kept, the rest filled from the
    /// least represented failure domains, ascending.
    fn wanted(&self, voters: &[String], nodes: &[Candidate]) -> Vec<String> {
        let eligible: BTreeMap<&str, &str> = nodes
            .iter()
            .filter(|n| n.eligible)
            .map(|n| (n.name.as_str(), n.domain.as_str()))
            .collect();
        let target = self.target(eligible.len());
        let mut chosen: Vec<&str> = voters
            .iter()
            .map(String::as_str)
            .filter(|v| eligible.contains_key(v))
            .collect();
        let mut per_domain: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &chosen {
            *per_domain.entry(eligible[v]).or_default() += 1;
        }
        // More kept than wanted (the count was lowered): drop from the most crowded domain,
        // the highest name first.
        while chosen.len() > target {
            let Some((i, _)) = chosen
                .iter()
                .enumerate()
                .max_by_key(|(_, v)| (per_domain[eligible[**v]], **v))
            else {
                break;
            };
            let gone = chosen.remove(i);
            if let Some(n) = per_domain.get_mut(eligible[gone]) {
                *n -= 1;
            }
        }
        while chosen.len() < target {
            let pick = eligible
                .iter()
                .filter(|(name, _)| !chosen.contains(name))
                .min_by_key(|(name, domain)| {
                    (
                        per_domain.get(*domain).copied().unwrap_or(0),
                        **domain,
                        **name,
                    )
                });
            let Some((name, domain)) = pick else {
                break;
            };
            chosen.push(name);
            *per_domain.entry(domain).or_default() += 1;
        }
        chosen.sort_unstable();
        chosen.into_iter().map(str::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn nodes(spec: &[(&str, &str, bool)]) -> Vec<Candidate> {
        spec.iter()
            .map(|(n, d, e)| Candidate {
                name: n.to_string(),
                domain: d.to_string(),
                eligible: *e,
            })
            .collect()
    }

    fn nine(down: &[&str]) -> Vec<Candidate> {
        (0..9)
            .map(|i| {
                let name = format!("n{i}");
                Candidate {
                    eligible: !down.contains(&name.as_str()),
                    name,
                    domain: format!("zone{}", i % 3),
                }
            })
            .collect()
    }

    fn settings() -> Settings {
        Settings {
            replace_after: Duration::from_secs(30),
            ..Settings::default()
        }
    }

    fn publish(plan: Plan) -> (VoterConfig, Why) {
        match plan {
            Plan::Publish(c, why) => (c, why),
            other => panic!("expected a publish, got {other:?}"),
        }
    }

    fn read(version: &str, mark: Option<Mark>, at: Instant) -> DutyRead {
        DutyRead {
            version: Some(version.to_string()),
            mark,
            fence: 0,
            started: at,
            done: at + Duration::from_millis(5),
        }
    }

    fn serving(read: u64, serves: u64) -> Option<Mark> {
        Some(Mark {
            read,
            serves: Some(serves),
        })
    }

    #[test]
    fn the_first_configuration_spreads_over_the_domains() {
        let mut s = Steward::new(settings());
        let t = Instant::now();
        let (c, why) = publish(s.plan(None, &nine(&["n1"]), t).unwrap());
        assert_eq!(why, Why::First);
        assert_eq!(c.generation, 1);
        // n1 is down: zone1 gives n4 first, then n7 in the second round.
        assert_eq!(c.current, ["n0", "n2", "n3", "n4", "n7"]);
        // No eligible node: nothing to publish.
        let none = nodes(&[("a", "", false)]);
        assert_eq!(
            Steward::new(settings()).plan(None, &none, t),
            Ok(Plan::Idle)
        );
        // Fewer eligible nodes than the count: the first waits until they stop changing.
        let mut s = Steward::new(settings());
        let one = nodes(&[("a", "", true), ("b", "", false)]);
        let two = nodes(&[("a", "", true), ("b", "", true)]);
        assert_eq!(s.plan(None, &one, t), Ok(Plan::Idle));
        assert_eq!(
            s.plan(None, &two, t + Duration::from_secs(8)),
            Ok(Plan::Idle)
        );
        assert_eq!(
            s.plan(None, &two, t + Duration::from_secs(17)),
            Ok(Plan::Idle)
        );
        let (c, _) = publish(s.plan(None, &two, t + Duration::from_secs(18)).unwrap());
        assert_eq!(c.current, ["a", "b"]);
    }

    #[test]
    fn a_voter_gone_long_enough_is_replaced_in_its_domain_and_nothing_else_moves() {
        let mut s = Steward::new(settings());
        let t = Instant::now();
        let c = VoterConfig::new(1, ["n0", "n1", "n2", "n3", "n4"], Vec::<&str>::new()).unwrap();
        assert_eq!(s.plan(Some(&c), &nine(&[]), t), Ok(Plan::Idle));
        // n1 (zone1) goes: nothing for replace_after, then n7 (zone1, fewest voters) comes in.
        let down = nine(&["n1"]);
        assert_eq!(s.plan(Some(&c), &down, t), Ok(Plan::Idle));
        assert_eq!(
            s.plan(Some(&c), &down, t + Duration::from_secs(29)),
            Ok(Plan::Idle)
        );
        let (j, why) = publish(
            s.plan(Some(&c), &down, t + Duration::from_secs(30))
                .unwrap(),
        );
        assert_eq!(why, Why::Change);
        assert_eq!(j.generation, 2);
        assert_eq!(j.current, c.current);
        assert_eq!(j.next, ["n0", "n2", "n3", "n4", "n7"]);
        // A voter back before replace_after resets the wait.
        let mut s = Steward::new(settings());
        assert_eq!(s.plan(Some(&c), &down, t), Ok(Plan::Idle));
        assert_eq!(
            s.plan(Some(&c), &nine(&[]), t + Duration::from_secs(20)),
            Ok(Plan::Idle)
        );
        assert_eq!(
            s.plan(Some(&c), &down, t + Duration::from_secs(40)),
            Ok(Plan::Idle)
        );
    }

    #[test]
    fn a_growing_cluster_gets_more_voters_and_a_lower_count_fewer() {
        let t = Instant::now();
        let c = VoterConfig::new(1, ["a"], Vec::<&str>::new()).unwrap();
        let three = nodes(&[("a", "z1", true), ("b", "z1", true), ("c", "z2", true)]);
        let mut s = Steward::new(Settings {
            replace_after: Duration::ZERO,
            ..settings()
        });
        let (j, _) = publish(s.plan(Some(&c), &three, t).unwrap());
        // c first: its domain has no voter yet.
        assert_eq!(j.next, ["a", "b", "c"]);
        // Four eligible nodes still make three voters.
        let four = nodes(&[
            ("a", "z1", true),
            ("b", "z1", true),
            ("c", "z2", true),
            ("d", "z3", true),
        ]);
        let c3 = VoterConfig::new(3, ["a", "b", "c"], Vec::<&str>::new()).unwrap();
        assert_eq!(s.plan(Some(&c3), &four, t), Ok(Plan::Idle));
        let mut one = Steward::new(Settings {
            count: 1,
            replace_after: Duration::ZERO,
            ..settings()
        });
        let (j, _) = publish(one.plan(Some(&c3), &four, t).unwrap());
        // The most crowded domain gives up its voters first, the highest name first.
        assert_eq!(j.next, ["a"]);
    }

    #[test]
    fn a_joint_phase_ends_once_every_voter_moved_and_the_drain_passed() {
        let mut s = Steward::new(settings());
        let t = Instant::now();
        let j = VoterConfig::new(2, ["a", "b", "c"], ["a", "b", "d"]).unwrap();
        let all = nodes(&[
            ("a", "", true),
            ("b", "", true),
            ("c", "", false),
            ("d", "", true),
        ]);
        let Plan::Read(voters) = s.plan(Some(&j), &all, t).unwrap() else {
            panic!("reads first");
        };
        assert_eq!(voters, ["a", "b", "c", "d"]);
        s.read(2, "a", read("1", serving(2, 2), t));
        s.read(2, "b", read("1", serving(2, 1), t));
        s.read(2, "c", read("1", serving(1, 1), t));
        s.read(2, "d", read("1", serving(2, 2), t));
        assert_eq!(
            s.plan(Some(&j), &all, t),
            Ok(Plan::Read(vec!["b".into(), "c".into()]))
        );
        // b moves; c is quiet on one version through the window, then fenced.
        let t1 = t + Duration::from_secs(1);
        s.read(2, "b", read("2", serving(2, 2), t1));
        s.read(2, "c", read("1", serving(1, 1), t1));
        assert_eq!(s.plan(Some(&j), &all, t1), Ok(Plan::Read(vec!["c".into()])));
        let t6 = t + Duration::from_secs(7);
        s.read(2, "c", read("1", serving(1, 1), t6));
        assert_eq!(
            s.plan(Some(&j), &all, t6),
            Ok(Plan::Fence {
                voter: "c".into(),
                version: Some("1".into()),
                generation: 2
            })
        );
        s.fenced(2, "c", true);
        let Plan::FinishAt(at) = s.plan(Some(&j), &all, t6).unwrap() else {
            panic!("waits for the drain");
        };
        assert_eq!(at, t6 + Timers::default().drain());
        let (f, why) = publish(s.plan(Some(&j), &all, at).unwrap());
        assert_eq!(why, Why::Finish);
        assert_eq!(f.generation, 3);
        assert_eq!(f.current, ["a", "b", "d"]);
    }

    #[test]
    fn a_voter_that_writes_is_never_fenced() {
        let mut s = Steward::new(settings());
        let t = Instant::now();
        let j = VoterConfig::new(2, ["a"], ["b"]).unwrap();
        let all = nodes(&[("a", "", true), ("b", "", true)]);
        s.plan(Some(&j), &all, t).unwrap();
        s.read(2, "b", read("1", serving(2, 2), t));
        // a writes a new version every read but stays on generation 1.
        for i in 0..20u64 {
            let at = t + Duration::from_secs(i);
            s.read(2, "a", read(&i.to_string(), serving(2, 1), at));
            assert_eq!(s.plan(Some(&j), &all, at), Ok(Plan::Read(vec!["a".into()])));
        }
        // A fence refused (the record changed) sends it back to being read.
        let mut s = Steward::new(settings());
        s.plan(Some(&j), &all, t).unwrap();
        s.read(2, "a", read("1", None, t));
        s.read(2, "a", read("1", None, t + Duration::from_secs(7)));
        assert!(matches!(
            s.plan(Some(&j), &all, t + Duration::from_secs(7)),
            Ok(Plan::Fence { .. })
        ));
        s.fenced(2, "a", false);
        assert!(matches!(
            s.plan(Some(&j), &all, t + Duration::from_secs(7)),
            Ok(Plan::Read(_))
        ));
    }

    #[test]
    fn a_joint_phase_whose_new_voter_is_gone_is_replaced_keeping_current() {
        let mut s = Steward::new(Settings {
            count: 3,
            ..settings()
        });
        let t = Instant::now();
        let j = VoterConfig::new(2, ["n0", "n1", "n2"], ["n0", "n1", "n5"]).unwrap();
        let down = nine(&["n2", "n5"]);
        assert!(matches!(s.plan(Some(&j), &down, t), Ok(Plan::Read(_))));
        let (r, why) = publish(
            s.plan(Some(&j), &down, t + Duration::from_secs(30))
                .unwrap(),
        );
        assert_eq!(why, Why::Replace);
        assert_eq!(r.generation, 3);
        assert_eq!(r.current, j.current);
        assert_eq!(r.next, ["n0", "n1", "n8"]);
    }
}
