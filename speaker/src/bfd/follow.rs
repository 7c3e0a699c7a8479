//! How a BGP session follows its BFD session (RFC 5882 section 4.3): when BFD goes down after
//! having been Up, the BGP session is stopped at once (its routes leave the router now, not
//! when the hold timer expires), and it starts again once BFD is Up again, so a path that
//! carries TCP but drops BFD does not flap the session.
//!
//! The wait for BFD is bounded: [`HOLD_DOWN`] (5 s), doubled when BFD fails again within a
//! minute of the end of the last wait, up to [`MAX_HOLD_DOWN`] (60 s). Routers often create their BFD session only for an
//! existing BGP neighbour (FRR's dynamic neighbours from `bgp listen range` do: the neighbour,
//! and with it the BFD session, is deleted when BGP goes down), so waiting for BFD alone would
//! keep such a session down for ever. On a path that is really down, the BGP connection cannot
//! come up anyway.
//!
//! A BFD session that never came up does not hold BGP back: a router without BFD configured
//! keeps its BGP session, as with FRR. A Down caused by the peer saying AdminDown is not a
//! failure (RFC 5882 section 3.2) and leaves BGP alone.
//!
//! Only a failure of the BGP session's own BFD protects it, as in FRR's bgpd: BFD counts once
//! the BGP session is Established, and then only an Up that came after that, or one that has
//! lasted [`settle`] since. A router that recreates its BFD session with each BGP session
//! (FRR's dynamic neighbours again) tears the old one down while the new BGP session comes up;
//! that Down is the old session's end, and taking it for a failure held a BGPPeer's new session
//! down for 5 s after about one edit in eight in the lab.

use std::time::{Duration, Instant};

use ferrolb_bfd::packet::State;
use tokio::sync::watch;

use super::Status;

/// The first wait for BFD after it failed, before the BGP session starts again anyway.
pub const HOLD_DOWN: Duration = Duration::from_secs(5);
/// The longest wait, reached by failures less than a minute apart.
pub const MAX_HOLD_DOWN: Duration = Duration::from_secs(60);

/// How long a BFD session Up since before the BGP session was Established must stay Up before
/// its failure counts: three detection times, and at least [`MIN_SETTLE`]. A router that tears
/// down the BFD session of the BGP session it just closed is heard within one detection time
/// (its packets stop, or its new session says Down).
pub fn settle(status: &Status) -> Duration {
    status
        .detection_time
        .map_or(MIN_SETTLE, |d| (d * 3).max(MIN_SETTLE))
}

/// The shortest [`settle`].
pub const MIN_SETTLE: Duration = Duration::from_secs(3);

/// What the BGP session must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// BFD saw the path fail: stop the session and do not reconnect.
    Stop,
    /// BFD is Up again (or no longer configured): start the session again.
    Start,
    /// The wait for BFD is over while it is still not Up: start the session again anyway (the
    /// router may set its BFD session up only once BGP is).
    WaitOver,
}

/// The pure rule, fed every status change of the peer's BFD session (`None`: the peer has no
/// BFD session any more).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldDown {
    /// BFD has been Up since the last Stop (or since the start).
    was_up: bool,
    /// The BGP session is stopped by us and waits for BFD.
    holding: bool,
    /// The session's `ups` when last seen.
    ups: u64,
    /// When the BGP session became Established, and the BFD session's `ups` then; none while
    /// it is not.
    established: Option<(Instant, u64)>,
    /// When the BGP session starts again even without BFD.
    release_at: Option<Instant>,
    /// The wait the last Stop got, and when that session started again.
    last_wait: Duration,
    released_at: Option<Instant>,
}

impl HoldDown {
    /// The verdict for a new status at `now`, if any.
    pub fn update(&mut self, status: Option<Status>, now: Instant) -> Option<Verdict> {
        let Some(status) = status else {
            self.was_up = false;
            self.ups = 0;
            return self.release(now);
        };
        if status.ups < self.ups {
            // Another session: count afresh. Its Ups all came after the BGP session's start.
            self.ups = status.ups;
            self.was_up = false;
            if let Some((_, ups)) = self.established.as_mut() {
                *ups = 0;
            }
        }
        if status.ups > self.ups {
            // It was Up since last seen, even if it is no longer.
            self.ups = status.ups;
            self.was_up = true;
        }
        if status.state == State::Up {
            self.was_up = true;
            return self.release(now);
        }
        let protects = self.established.is_some_and(|(since, ups)| {
            status.ups > ups || now.saturating_duration_since(since) >= settle(&status)
        });
        let failed = std::mem::take(&mut self.was_up)
            && protects
            && status.remote_state != State::AdminDown
            && status.state != State::AdminDown;
        if failed && !self.holding {
            let again_soon = self
                .released_at
                .is_some_and(|r| now.saturating_duration_since(r) < Duration::from_secs(60));
            let wait = if again_soon {
                (self.last_wait * 2).clamp(HOLD_DOWN, MAX_HOLD_DOWN)
            } else {
                HOLD_DOWN
            };
            self.last_wait = wait;
            self.release_at = Some(now + wait);
            self.holding = true;
            return Some(Verdict::Stop);
        }
        None
    }

    /// Takes `status` as the starting point of a BFD session first seen now (a new follower, or
    /// a link just swapped to another session): its Ups from before we followed it do not
    /// count, so a session that was Up once and is Down now does not stop a BGP session that
    /// never ran beside it. Only an Up seen from here on arms the hold-down.
    pub fn baseline(&mut self, status: Option<Status>) {
        (self.ups, self.was_up) = match status {
            Some(s) => (s.ups, s.state == State::Up),
            None => (0, false),
        };
        if let Some((_, ups)) = self.established.as_mut() {
            *ups = self.ups;
        }
    }

    /// Whether the BGP session is Established, at `now`: BFD protects it only from then on.
    pub fn bgp_established(&mut self, established: bool, now: Instant) {
        match (established, self.established) {
            (true, None) => self.established = Some((now, self.ups)),
            (false, Some(_)) => self.established = None,
            _ => {}
        }
    }

    /// The time at `now`: Start when the wait for BFD is over.
    pub fn on_timer(&mut self, now: Instant) -> Option<Verdict> {
        if self.release_at.is_some_and(|at| at <= now) {
            return self.release(now).map(|_| Verdict::WaitOver);
        }
        None
    }

    /// When [`HoldDown::on_timer`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        self.release_at
    }

    fn release(&mut self, now: Instant) -> Option<Verdict> {
        self.release_at = None;
        let held = std::mem::take(&mut self.holding);
        if held {
            self.released_at = Some(now);
        }
        held.then_some(Verdict::Start)
    }

    /// Whether the BGP session is held down, waiting for BFD.
    pub fn holding(&self) -> bool {
        self.holding
    }
}

/// The receiving end of a BGP session's BFD link: the driver swaps in the current BFD
/// session's status channel (or none) as the BGPPeer's `bfdProfile` comes and goes, without
/// restarting the BGP session.
pub type Link = watch::Receiver<Option<watch::Receiver<Status>>>;

/// Follows the BFD session on a [`Link`] and yields the [`HoldDown`]'s verdicts.
pub struct Follower {
    link: Link,
    current: Option<watch::Receiver<Status>>,
    hold: HoldDown,
    /// The link's sender is gone: only the current session (if any) is followed.
    link_closed: bool,
}

impl Follower {
    /// Follows `link`.
    pub fn new(mut link: Link) -> Follower {
        let mut current = link.borrow_and_update().clone();
        let mut hold = HoldDown::default();
        hold.baseline(current.as_mut().map(|rx| *rx.borrow_and_update()));
        Follower {
            link,
            current,
            hold,
            link_closed: false,
        }
    }

    /// Whether the BGP session is held down, waiting for BFD.
    pub fn holding(&self) -> bool {
        self.hold.holding()
    }

    /// Tells whether the BGP session is Established now (see [`HoldDown::bgp_established`]).
    pub fn bgp_established(&mut self, established: bool) {
        self.hold.bgp_established(established, Instant::now());
    }

    /// Waits for the next verdict (forever when none comes).
    pub async fn next(&mut self) -> Verdict {
        loop {
            let link_changed = async {
                if self.link_closed {
                    std::future::pending().await
                } else {
                    self.link.changed().await
                }
            };
            let status_changed = async {
                match self.current.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            };
            let deadline = self.hold.deadline();
            let released = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                    None => std::future::pending().await,
                }
            };
            let status = tokio::select! {
                r = link_changed => {
                    if r.is_err() {
                        self.link_closed = true;
                        continue;
                    }
                    self.current = self.link.borrow_and_update().clone();
                    // Another session (or none): what the old one did no longer counts, a
                    // session held for the old one is released, and the new one's past is
                    // its baseline.
                    let released = self.hold.update(None, Instant::now());
                    let status = self.current.as_mut().map(|rx| *rx.borrow_and_update());
                    self.hold.baseline(status);
                    if let Some(v) = released {
                        return v;
                    }
                    continue;
                }
                () = released => {
                    match self.hold.on_timer(Instant::now()) {
                        Some(v) => return v,
                        None => continue,
                    }
                }
                r = status_changed => match r {
                    Ok(()) => self.current.as_mut().map(|rx| *rx.borrow_and_update()),
                    // The BFD session is gone.
                    Err(_) => {
                        self.current = None;
                        None
                    }
                }
            };
            if let Some(v) = self.hold.update(status, Instant::now()) {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    impl HoldDown {
        /// A rule whose BGP session is Established (since the rule's epoch: the tests' instants
        /// come from [`later`], past any settling).
        fn established() -> HoldDown {
            let mut g = HoldDown::default();
            g.bgp_established(true, Instant::now());
            g
        }

        /// `update` at an instant past the settling, far from any hold-down's end.
        fn update_now(&mut self, status: Option<Status>) -> Option<Verdict> {
            self.update(status, later())
        }
    }

    /// An instant an hour from now: any BFD session Up then has settled.
    fn later() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// BFD that stays down releases the BGP session after the hold-down; failures less than a
    /// minute apart double it up to the cap, a quiet minute resets it.
    #[test]
    fn the_wait_for_bfd_is_bounded_and_grows_with_flaps() {
        let t0 = later();
        let mut g = HoldDown::established();
        let up = status(State::Up, State::Up);
        let down = status(State::Down, State::Down);
        g.update(up, t0);
        assert_eq!(g.update(down, t0), Some(Verdict::Stop));
        assert_eq!(g.deadline(), Some(t0 + HOLD_DOWN));
        assert_eq!(g.on_timer(t0 + HOLD_DOWN - Duration::from_millis(1)), None);
        assert_eq!(g.on_timer(t0 + HOLD_DOWN), Some(Verdict::WaitOver));
        assert_eq!(g.deadline(), None);
        let mut at = t0 + HOLD_DOWN;
        let mut waits = Vec::new();
        for _ in 0..6 {
            g.update(up, at);
            assert_eq!(g.update(down, at), Some(Verdict::Stop));
            let wait = g.deadline().unwrap() - at;
            waits.push(wait.as_secs());
            at += wait;
            assert_eq!(g.on_timer(at), Some(Verdict::WaitOver));
        }
        assert_eq!(waits, [10, 20, 40, 60, 60, 60]);
        // BFD Up before the wait ends starts the session at once, and the timer is cleared.
        g.update(up, at);
        g.update(down, at);
        assert_eq!(g.update(up, at), Some(Verdict::Start));
        assert_eq!(g.deadline(), None);
        // A minute without failures since it started again: back to the first wait.
        let later = at + Duration::from_secs(61);
        g.update(up, later);
        g.update(down, later);
        assert_eq!(g.deadline(), Some(later + HOLD_DOWN));
    }

    fn status(state: State, remote_state: State) -> Option<Status> {
        Some(Status {
            state,
            remote_state,
            ..Status::default()
        })
    }

    /// A status that has been Up `ups` times.
    fn after(ups: u64, state: State) -> Option<Status> {
        Some(Status {
            state,
            ups,
            ..Status::default()
        })
    }

    /// An Up missed between two Downs (the watch channel kept only the last) still counts.
    #[test]
    fn a_missed_up_still_counts() {
        let mut g = HoldDown::established();
        assert_eq!(g.update_now(after(0, State::Down)), None);
        assert_eq!(g.update_now(after(1, State::Down)), Some(Verdict::Stop));
        assert_eq!(g.update_now(after(2, State::Up)), Some(Verdict::Start));
        // A new session starts counting at 0 again.
        assert_eq!(g.update_now(after(0, State::Down)), None);
        assert_eq!(g.update_now(after(1, State::Up)), None);
        assert_eq!(g.update_now(after(1, State::Down)), Some(Verdict::Stop));
    }

    #[test]
    fn down_after_up_stops_and_up_starts_again() {
        let mut g = HoldDown::established();
        // Never up: BGP is not held back.
        assert_eq!(g.update_now(status(State::Down, State::Down)), None);
        assert_eq!(g.update_now(status(State::Init, State::Down)), None);
        assert_eq!(g.update_now(status(State::Up, State::Up)), None);
        assert_eq!(
            g.update_now(status(State::Down, State::Down)),
            Some(Verdict::Stop)
        );
        assert!(g.holding());
        // Still down, Init: no second Stop, no Start.
        assert_eq!(g.update_now(status(State::Down, State::Down)), None);
        assert_eq!(g.update_now(status(State::Init, State::Down)), None);
        assert_eq!(
            g.update_now(status(State::Up, State::Up)),
            Some(Verdict::Start)
        );
        assert!(!g.holding());
    }

    #[test]
    fn admin_down_is_not_a_failure() {
        let mut g = HoldDown::established();
        g.update_now(status(State::Up, State::Up));
        assert_eq!(g.update_now(status(State::Down, State::AdminDown)), None);
        // And afterwards a plain Down, without an Up in between, is no failure either.
        assert_eq!(g.update_now(status(State::Down, State::Down)), None);
    }

    #[test]
    fn bfd_removed_releases_a_held_session() {
        let mut g = HoldDown::established();
        g.update_now(status(State::Up, State::Up));
        assert_eq!(
            g.update_now(status(State::Down, State::Down)),
            Some(Verdict::Stop)
        );
        assert_eq!(g.update_now(None), Some(Verdict::Start));
        assert_eq!(g.update_now(None), None);
    }

    /// A BFD session that was Up before the follower first saw it, and is Down now, does not
    /// stop the new BGP session: it never came up during that session's life. The lab's BGP
    /// suite caught the old rule, which read the lifetime count `ups` as a fresh Up and held a
    /// restarted BGP session for 5 s.
    #[tokio::test]
    async fn a_session_down_since_before_the_follower_does_not_hold_bgp() {
        let (session_tx, session_rx) = watch::channel(after(3, State::Down).unwrap());
        let (link_tx, link_rx) = watch::channel(Some(session_rx));
        let mut f = Follower::new(link_rx);
        f.bgp_established(true);
        // It goes on trying (Init) without coming up.
        session_tx.send_replace(after(3, State::Init).unwrap());
        let idle = tokio::time::timeout(Duration::from_millis(50), f.next()).await;
        assert!(idle.is_err(), "a new follower stopped BGP: {idle:?}");
        // The same on a swap to another such session.
        let (other_tx, other_rx) = watch::channel(after(7, State::Down).unwrap());
        link_tx.send_replace(Some(other_rx));
        let idle = tokio::time::timeout(Duration::from_millis(50), f.next()).await;
        assert!(idle.is_err(), "a swapped link stopped BGP: {idle:?}");
        // An Up and a Down seen from here on still stop it.
        other_tx.send_replace(after(8, State::Up).unwrap());
        other_tx.send_replace(after(8, State::Down).unwrap());
        let v = tokio::time::timeout(Duration::from_secs(5), f.next())
            .await
            .unwrap();
        assert_eq!(v, Verdict::Stop);
        drop(session_tx);
    }

    /// A session Up when first seen and Down later is a failure.
    #[test]
    fn a_baseline_that_is_up_counts_as_up() {
        let mut g = HoldDown::established();
        g.baseline(after(4, State::Up));
        assert_eq!(g.update_now(after(4, State::Down)), Some(Verdict::Stop));
        let mut g = HoldDown::established();
        g.baseline(after(4, State::Down));
        assert_eq!(g.update_now(after(4, State::Down)), None);
        assert_eq!(g.update_now(after(4, State::Init)), None);
    }

    /// The follower sees status changes and a swapped session, and reports the hold-down's verdicts.
    #[tokio::test]
    async fn follower_follows_swapped_sessions() {
        let (session_tx, session_rx) = watch::channel(Status::default());
        let (link_tx, link_rx) = watch::channel(Some(session_rx));
        let mut f = Follower::new(link_rx);
        f.bgp_established(true);
        // Up and Down again before the follower looked: it still stops the session.
        session_tx.send_replace(after(1, State::Up).unwrap());
        session_tx.send_replace(after(1, State::Down).unwrap());
        let v = tokio::time::timeout(Duration::from_secs(5), f.next())
            .await
            .unwrap();
        assert_eq!(v, Verdict::Stop);
        // The profile is taken off the BGPPeer: the session is released.
        link_tx.send_replace(None);
        let v = tokio::time::timeout(Duration::from_secs(5), f.next())
            .await
            .unwrap();
        assert_eq!(v, Verdict::Start);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), f.next())
                .await
                .is_err()
        );
    }

    /// A BGPPeer edit restarts the BGP session; FRR (dynamic neighbours) deletes the old one's
    /// BFD session and creates another when the new BGP session is Established. The end of
    /// the old BFD session is no failure of the new BGP session: only the Up that follows
    /// protects it.
    #[test]
    fn the_old_bfd_session_ending_does_not_hold_the_new_bgp_session() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut g = HoldDown::default();
        g.baseline(after(5, State::Up));
        g.bgp_established(true, t0);
        assert_eq!(g.update(after(5, State::Down), t0 + ms(900)), None);
        assert_eq!(g.update(after(5, State::Init), t0 + ms(950)), None);
        assert_eq!(g.update(after(6, State::Up), t0 + ms(1000)), None);
        assert!(!g.holding());
        // The new BFD session protects it at once.
        assert_eq!(
            g.update(after(6, State::Down), t0 + ms(1100)),
            Some(Verdict::Stop)
        );
    }

    /// A router that keeps its BFD session through the BGP restart: the Up protects the new
    /// BGP session once it has lasted the settling time.
    #[test]
    fn an_up_from_before_the_bgp_session_protects_it_once_settled() {
        let t0 = Instant::now();
        let s = Status {
            state: State::Up,
            remote_state: State::Up,
            detection_time: Some(Duration::from_millis(300)),
            ups: 2,
            ..Status::default()
        };
        assert_eq!(settle(&s), MIN_SETTLE);
        let down = Some(Status {
            state: State::Down,
            ..s
        });
        let mut g = HoldDown::default();
        g.baseline(Some(s));
        g.bgp_established(true, t0);
        assert_eq!(g.update(down, t0 + MIN_SETTLE / 2), None);
        let mut g = HoldDown::default();
        g.baseline(Some(s));
        g.bgp_established(true, t0);
        assert_eq!(g.update(down, t0 + MIN_SETTLE), Some(Verdict::Stop));
        // A slow BFD settles over three of its detection times.
        let slow = Status {
            detection_time: Some(Duration::from_secs(2)),
            ..s
        };
        assert_eq!(settle(&slow), Duration::from_secs(6));
    }

    /// BFD failing while BGP is not Established stops nothing (FRR's bgpd does the same): the
    /// BGP session is not carrying routes to protect, and its own attempts find the path.
    #[test]
    fn a_bfd_failure_while_bgp_is_not_established_is_not_held() {
        let t0 = Instant::now();
        let mut g = HoldDown::default();
        assert_eq!(g.update(after(1, State::Up), t0), None);
        assert_eq!(g.update(after(1, State::Down), t0), None);
        // Established, then lost again: a BFD failure after that stops nothing either.
        g.bgp_established(true, t0);
        assert_eq!(g.update(after(2, State::Up), t0), None);
        g.bgp_established(false, t0);
        assert_eq!(g.update(after(2, State::Down), t0 + MIN_SETTLE), None);
    }
}
