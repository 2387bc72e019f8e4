//! Telling a duplicate from a bug: classification of a transition that updated no row.

use crate::error::RowProblem;
use crate::transition::declared::Transition;

/// The row as the database showed it after the conditional UPDATE matched nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    pub found: bool,
    pub state: Option<String>,
    pub version: Option<i64>,
    pub first_result: Option<String>,
}

/// Why the conditional UPDATE matched no row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Classified {
    AlreadyDone {
        current: usize,
        first_result: Option<String>,
    },
    /// The row is in a state that can still reach `from`: the call came early.
    NotYet {
        current: usize,
    },
    IllegalState {
        current: usize,
    },
    NotFound,
    StaleVersion {
        expected: i64,
        actual: i64,
    },
    /// An event older than the row (watermark): the row's version is past it.
    Superseded {
        current: usize,
        version: i64,
    },
    /// The row still looks like it is in `from` with the expected version: a concurrent
    /// transaction changed it after this statement's snapshot was taken. Read again.
    LostRace,
    Corrupt(RowProblem),
}

/// The version condition of a transition besides its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Any version.
    Any,
    /// Optimistic locking: the row's version must be this one.
    Expected(i64),
    /// An event stream's watermark: the row's version must be below this event's, and
    /// takes it.
    Watermark(i64),
}

pub(crate) fn classify(transition: &Transition, observed: Observed, guard: Guard) -> Classified {
    if !observed.found {
        return Classified::NotFound;
    }
    let Some(state) = observed.state else {
        return Classified::Corrupt(RowProblem::NullState);
    };
    let definition = transition.definition;
    let Some(current) = definition.state_index(&state) else {
        return Classified::Corrupt(RowProblem::UnknownState(state));
    };
    if let Guard::Watermark(event) = guard {
        // Duplicates and old events are told by the version alone: the row took the
        // version of every event it applied.
        let Some(version) = observed.version else {
            return Classified::Corrupt(RowProblem::NullVersion);
        };
        if version == event {
            return Classified::AlreadyDone {
                current,
                first_result: observed.first_result,
            };
        }
        if version > event {
            return Classified::Superseded { current, version };
        }
        if current == transition.from {
            // In `from` below the event's version: the UPDATE should have matched.
            return Classified::LostRace;
        }
        if transition.from == transition.to {
            // An event that keeps the state, on a row elsewhere: no later state is "done"
            // for it.
            return if definition.reaches(current, transition.from) {
                Classified::NotYet { current }
            } else {
                Classified::IllegalState { current }
            };
        }
    }
    if current == transition.to || definition.reaches(transition.to, current) {
        return Classified::AlreadyDone {
            current,
            first_result: observed.first_result,
        };
    }
    if current != transition.from {
        return if definition.reaches(current, transition.from) {
            Classified::NotYet { current }
        } else {
            Classified::IllegalState { current }
        };
    }
    let Some(actual) = observed.version else {
        return Classified::Corrupt(RowProblem::NullVersion);
    };
    match guard {
        Guard::Expected(expected) if expected != actual => {
            Classified::StaleVersion { expected, actual }
        }
        _ => Classified::LostRace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::definition::Definition;
    use crate::machine::sql::{MachineSql, Statements};

    // CREATED(0) -> PAID(1) -> SHIPPED(2); CREATED -> CANCELLED(3)
    static ORDER: Definition = Definition {
        name: "Order",
        id: "orders",
        table: "orders",
        key_columns: &["id"],
        state_column: "state",
        version_column: "version",
        results_table: "idem_results",
        states: &["CREATED", "PAID", "SHIPPED", "CANCELLED"],
        transitions: &[(0, 1), (1, 2), (0, 3)],
        reachable: &[(0, 1), (0, 2), (0, 3), (1, 2)],
        sql: MachineSql::new([Statements::NONE; crate::Dialect::ALL.len()]),
    };

    fn pay() -> Transition {
        Transition {
            definition: &ORDER,
            from: 0,
            to: 1,
        }
    }

    fn row(state: &str, version: i64) -> Observed {
        Observed {
            found: true,
            state: Some(state.into()),
            version: Some(version),
            first_result: None,
        }
    }

    #[test]
    fn target_and_later_states_are_duplicates() {
        for (state, index) in [("PAID", 1), ("SHIPPED", 2)] {
            assert_eq!(
                classify(&pay(), row(state, 2), Guard::Any),
                Classified::AlreadyDone {
                    current: index,
                    first_result: None
                }
            );
        }
    }

    #[test]
    fn a_branch_not_reachable_from_the_target_is_illegal() {
        assert_eq!(
            classify(&pay(), row("CANCELLED", 2), Guard::Any),
            Classified::IllegalState { current: 3 }
        );
    }

    #[test]
    fn a_state_that_can_still_reach_the_source_is_not_yet() {
        // ship (PAID -> SHIPPED) while CREATED: CREATED can still reach PAID.
        let ship = Transition {
            definition: &ORDER,
            from: 1,
            to: 2,
        };
        assert_eq!(
            classify(&ship, row("CREATED", 0), Guard::Any),
            Classified::NotYet { current: 0 }
        );
        // ...but not once CANCELLED: CANCELLED reaches nothing.
        assert_eq!(
            classify(&ship, row("CANCELLED", 1), Guard::Any),
            Classified::IllegalState { current: 3 }
        );
    }

    #[test]
    fn missing_row_is_not_found() {
        assert_eq!(
            classify(&pay(), Observed::default(), Guard::Any),
            Classified::NotFound
        );
    }

    #[test]
    fn source_state_with_other_version_is_stale() {
        assert_eq!(
            classify(&pay(), row("CREATED", 4), Guard::Expected(3)),
            Classified::StaleVersion {
                expected: 3,
                actual: 4
            }
        );
    }

    #[test]
    fn source_state_that_should_have_matched_is_a_lost_race() {
        assert_eq!(
            classify(&pay(), row("CREATED", 3), Guard::Expected(3)),
            Classified::LostRace
        );
        assert_eq!(
            classify(&pay(), row("CREATED", 3), Guard::Any),
            Classified::LostRace
        );
    }

    #[test]
    fn bad_rows_are_reported() {
        assert_eq!(
            classify(&pay(), row("PAYED", 1), Guard::Any),
            Classified::Corrupt(RowProblem::UnknownState("PAYED".into()))
        );
        let mut null_state = row("PAID", 1);
        null_state.state = None;
        assert_eq!(
            classify(&pay(), null_state, Guard::Any),
            Classified::Corrupt(RowProblem::NullState)
        );
        let mut null_version = row("CREATED", 1);
        null_version.version = None;
        assert_eq!(
            classify(&pay(), null_version, Guard::Any),
            Classified::Corrupt(RowProblem::NullVersion)
        );
    }

    #[test]
    fn a_watermark_tells_a_duplicate_from_an_older_event_by_the_version() {
        // pay (CREATED -> PAID), delivered as event 5 of the order's stream.
        let pay = pay();
        assert_eq!(
            classify(&pay, row("PAID", 5), Guard::Watermark(5)),
            Classified::AlreadyDone {
                current: 1,
                first_result: None
            }
        );
        assert_eq!(
            classify(&pay, row("PAID", 7), Guard::Watermark(5)),
            Classified::Superseded {
                current: 1,
                version: 7
            }
        );
        // Older than the event and in `from`: the UPDATE should have matched.
        assert_eq!(
            classify(&pay, row("CREATED", 4), Guard::Watermark(5)),
            Classified::LostRace
        );
        // Older than the event, elsewhere: by the state, as without a watermark.
        assert_eq!(
            classify(&pay, row("CANCELLED", 2), Guard::Watermark(5)),
            Classified::IllegalState { current: 3 }
        );
        let mut no_version = row("PAID", 0);
        no_version.version = None;
        assert_eq!(
            classify(&pay, no_version, Guard::Watermark(5)),
            Classified::Corrupt(RowProblem::NullVersion)
        );
    }
}
