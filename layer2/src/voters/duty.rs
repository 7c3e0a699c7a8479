//! A voter node's duty (decision 0023, *Changing the voters*): how a speaker that is, or may
//! become, a voter reads the controller's voter configuration, says what its seat serves, and
//! confirms its configuration, so that the controller can tell when no voter serves an old
//! generation any more.
//!
//! Every voter node keeps a **duty record** (a Lease of its own in the speakers' namespace,
//! written only by it and, to fence it, by the controller) holding a [`Mark`]: the newest
//! generation it read and the generation its seat serves. Every tick (a second) it reads the
//! configuration afresh (a quorum read), works out what the read means for its seat
//! ([`plan`]), writes the mark **conditionally on the record's version it last saw**, and only
//! once that write has landed does it act on the read: start, move or retire its seat, and
//! confirm its configuration as of the read's start.
//!
//! Why each part is there:
//! * **The mark before the act.** The controller ends a joint phase when every voter's mark
//!   says it serves the new generation or later; a seat that started or moved first and wrote
//!   later could serve an old generation behind a mark that does not say so.
//! * **Conditional writes.** The controller fences a voter that has gone quiet (no write for
//!   the confirmation window) by writing the record on the version it read twice. Every later
//!   write of that voter is then refused (409), so it can never confirm again on a read made
//!   before the fence, and a seat serving below the fence drops ([`Planned::action`] is
//!   [`SeatAction::Drop`]).
//! * **Reads never go back.** A read older than the mark's `read` (a lagging API server, a new
//!   process reading before the old one's last write was seen) is ignored: a process never
//!   starts a seat on a generation its node has already read past.
//! * **A confirmation covers one generation step.** A seat serving `s` is confirmed only by a
//!   read of `s` or `s + 1`: once `s + 2` exists, the controller has seen every voter leave
//!   `s`, so a seat still on `s` must stay silent.

use std::fmt;
use std::str::FromStr;

use super::VoterConfig;

/// What a voter node's duty record says: the newest configuration generation it read, and the
/// generation its seat serves (`None`: no seat, or a seat retired).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The newest generation the node read (a read older than this is ignored).
    pub read: u64,
    /// The generation its seat serves, if it has a seat that has not retired.
    pub serves: Option<u64>,
}

/// Why a mark could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("voter mark {text:?}: {why} (expected \"read=<generation> serves=<generation>|none\")")]
pub struct MarkError {
    text: String,
    why: &'static str,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.serves {
            Some(s) => write!(f, "read={} serves={s}", self.read),
            None => write!(f, "read={} serves=none", self.read),
        }
    }
}

impl FromStr for Mark {
    type Err = MarkError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |why| MarkError {
            text: text.chars().take(64).collect(),
            why,
        };
        let mut words = text.split_ascii_whitespace();
        let read = words
            .next()
            .and_then(|w| w.strip_prefix("read="))
            .ok_or_else(|| error("no read="))?
            .parse::<u64>()
            .map_err(|_| error("read= is not a generation"))?;
        let serves = match words.next().and_then(|w| w.strip_prefix("serves=")) {
            Some("none") => None,
            Some(s) => Some(
                s.parse::<u64>()
                    .map_err(|_| error("serves= is not a generation"))?,
            ),
            None => return Err(error("no serves=")),
        };
        if words.next().is_some() {
            return Err(error("unexpected words after serves="));
        }
        Ok(Mark { read, serves })
    }
}

/// A seat as a duty tick sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeatState {
    /// The generation it serves.
    pub serves: u64,
    /// Whether it has retired (it reports nothing more).
    pub retired: bool,
}

/// What a read means for the node's seat, to be done once the mark is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeatAction {
    /// Nothing changes.
    Keep,
    /// Start a seat serving this generation (the node became a voter).
    Start(u64),
    /// Move the seat to this generation ([`super::Seat::move_to`]).
    MoveTo(u64),
    /// The node is no voter of the read configuration: the seat retires
    /// ([`super::Seat::retire`]).
    Retire,
    /// The seat serves below the controller's fence, or has retired: it ends for good. A
    /// later read of a configuration naming this node starts a new one.
    Drop,
}

/// The outcome of one duty tick's read ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planned {
    /// The read is older than one this node made before: nothing is written or done.
    Stale,
    /// Write `mark` (conditionally), then do `action`, and confirm the seat's configuration as
    /// of the read's start when `confirm`.
    Write {
        /// The mark to write.
        mark: Mark,
        /// What to do to the seat once the mark has landed.
        action: SeatAction,
        /// Whether the read confirms the seat's configuration.
        confirm: bool,
    },
}

/// What the read of `config` means for node `me`, whose duty record holds `last` (if any) and
/// `fence` (0 when unfenced), with its seat `seat`.
pub fn plan(
    me: &str,
    config: &VoterConfig,
    last: Option<Mark>,
    fence: u64,
    seat: Option<SeatState>,
) -> Planned {
    let g = config.generation;
    let read_before = last.map_or(0, |m| m.read);
    if g < read_before {
        return Planned::Stale;
    }
    let voter = config.has(me);
    let (action, serves) = match seat {
        Some(s) if s.serves < fence || s.retired => (SeatAction::Drop, None),
        Some(s) if !voter => (SeatAction::Retire, Some(s.serves)),
        // The seat serves on where it is until it moves; the mark says so.
        Some(s) if g > s.serves => (SeatAction::MoveTo(g), Some(s.serves)),
        Some(s) => (SeatAction::Keep, Some(s.serves)),
        // A new seat never starts below the fence (a fence is at most the newest generation
        // the controller published, so this read, at least as new, is never below it).
        None if voter && g >= fence => (SeatAction::Start(g), Some(g)),
        None => (SeatAction::Keep, None),
    };
    let confirm = serves.is_some_and(|s| g <= s + 1);
    Planned::Write {
        mark: Mark {
            read: g.max(read_before),
            serves,
        },
        action,
        confirm,
    }
}

/// Whether a node still has duty after a tick: it is a voter of `config`, or its seat has not
/// retired. A node without duty stops reading the configuration afresh (the watch tells it
/// when it becomes a voter).
pub fn on_duty(me: &str, config: &VoterConfig, seat: Option<SeatState>) -> bool {
    config.has(me) || seat.is_some_and(|s| !s.retired)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn config(generation: u64, current: &[&str], next: &[&str]) -> VoterConfig {
        VoterConfig::new(generation, current.to_vec(), next.to_vec()).unwrap()
    }

    fn seat(serves: u64) -> Option<SeatState> {
        Some(SeatState {
            serves,
            retired: false,
        })
    }

    fn write(planned: Planned) -> (Mark, SeatAction, bool) {
        match planned {
            Planned::Write {
                mark,
                action,
                confirm,
            } => (mark, action, confirm),
            Planned::Stale => panic!("stale"),
        }
    }

    #[test]
    fn marks_read_back_as_written() {
        for mark in [
            Mark {
                read: 7,
                serves: Some(6),
            },
            Mark {
                read: 0,
                serves: None,
            },
        ] {
            assert_eq!(mark.to_string().parse::<Mark>(), Ok(mark));
        }
        assert_eq!("read=7 serves=6".parse::<Mark>().unwrap().serves, Some(6));
        for bad in [
            "",
            "read=7",
            "serves=1 read=2",
            "read=x serves=1",
            "read=1 serves=-1",
            "read=1 serves=1 more",
        ] {
            let e = bad.parse::<Mark>().unwrap_err();
            assert!(e.to_string().contains("voter mark"), "{e}");
        }
    }

    #[test]
    fn a_new_voter_writes_its_mark_then_starts() {
        let c = config(3, &["a", "b", "c"], &["a", "b", "d"]);
        let (mark, action, confirm) = write(plan("d", &c, None, 0, None));
        assert_eq!(
            mark,
            Mark {
                read: 3,
                serves: Some(3)
            }
        );
        assert_eq!(action, SeatAction::Start(3));
        assert!(confirm);
        // A node of neither set writes that it serves nothing.
        let (mark, action, confirm) = write(plan("e", &c, None, 0, None));
        assert_eq!(mark.serves, None);
        assert_eq!(action, SeatAction::Keep);
        assert!(!confirm);
        assert!(!on_duty("e", &c, None));
        assert!(on_duty("d", &c, None));
    }

    #[test]
    fn a_staying_voter_moves_later_and_its_mark_says_where_it_is() {
        let c = config(3, &["a", "b", "c"], &["a", "b", "d"]);
        let (mark, action, confirm) = write(plan("a", &c, None, 0, seat(2)));
        assert_eq!(
            mark,
            Mark {
                read: 3,
                serves: Some(2)
            }
        );
        assert_eq!(action, SeatAction::MoveTo(3));
        assert!(confirm, "a read one generation on still confirms");
        // Two generations on, it may not report its old one any more.
        let c5 = config(5, &["a", "b", "d"], &[]);
        let (_, action, confirm) = write(plan("a", &c5, None, 0, seat(3)));
        assert_eq!(action, SeatAction::MoveTo(5));
        assert!(!confirm);
    }

    #[test]
    fn a_leaving_voter_retires_and_then_drops() {
        let c = config(4, &["a", "b", "d"], &[]);
        let (mark, action, confirm) = write(plan("c", &c, None, 0, seat(3)));
        assert_eq!(mark.serves, Some(3));
        assert_eq!(action, SeatAction::Retire);
        assert!(confirm, "it serves generation 3 while it retires");
        let retired = Some(SeatState {
            serves: 3,
            retired: true,
        });
        let (mark, action, _) = write(plan("c", &c, None, 0, retired));
        assert_eq!(mark.serves, None);
        assert_eq!(action, SeatAction::Drop);
        assert!(!on_duty("c", &c, retired));
    }

    #[test]
    fn a_fenced_seat_drops_and_a_stale_read_does_nothing() {
        let c = config(3, &["a", "b", "c"], &["a", "b", "d"]);
        let (mark, action, confirm) = write(plan("c", &c, None, 3, seat(2)));
        assert_eq!(action, SeatAction::Drop);
        assert_eq!(mark.serves, None);
        assert!(!confirm);
        // Below the fence nothing starts either.
        let old = config(2, &["a", "b", "c"], &[]);
        let (_, action, _) = write(plan("c", &old, None, 3, None));
        assert_eq!(action, SeatAction::Keep);
        // A read older than one made before is ignored, whatever it says.
        let last = Mark {
            read: 3,
            serves: Some(3),
        };
        assert_eq!(plan("c", &old, Some(last), 0, None), Planned::Stale);
    }
}
