//! Telling a duplicate from a bug: classification of a transition that updated no row.

use crate::error::RowProblem;
use crate::transition::Transition;

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
    /// The row still looks like it is in `from` with the expected version: a concurrent
    /// transaction changed it after this statement's snapshot was taken. Read again.
    LostRace,
    Corrupt(RowProblem),
}

pub(crate) fn classify(
    transition: &Transition,
    observed: Observed,
    expected: Option<i64>,
) -> Classified {
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
    match expected {
        Some(expected) if expected != actual => Classified::StaleVersion { expected, actual },
        _ => Classified::LostRace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Definition;
    use crate::sql::{MachineSql, Statements};

    const NO_SQL: Statements = Statements {
        transition: "",
        transition_guarded: "",
        transition_storing: "",
        transition_storing_guarded: "",
        update: "",
        update_guarded: "",
        classify: "",
        store_result: "",
        create_results_table: "",
        enforce: "",
    };

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
        sql: MachineSql {
            postgres: NO_SQL,
            sqlite: NO_SQL,
        },
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
                classify(&pay(), row(state, 2), None),
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
            classify(&pay(), row("CANCELLED", 2), None),
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
            classify(&ship, row("CREATED", 0), None),
            Classified::NotYet { current: 0 }
        );
        // ...but not once CANCELLED: CANCELLED reaches nothing.
        assert_eq!(
            classify(&ship, row("CANCELLED", 1), None),
            Classified::IllegalState { current: 3 }
        );
    }

    #[test]
    fn missing_row_is_not_found() {
        assert_eq!(
            classify(&pay(), Observed::default(), None),
            Classified::NotFound
        );
    }

    #[test]
    fn source_state_with_other_version_is_stale() {
        assert_eq!(
            classify(&pay(), row("CREATED", 4), Some(3)),
            Classified::StaleVersion {
                expected: 3,
                actual: 4
            }
        );
    }

    #[test]
    fn source_state_that_should_have_matched_is_a_lost_race() {
        assert_eq!(
            classify(&pay(), row("CREATED", 3), Some(3)),
            Classified::LostRace
        );
        assert_eq!(
            classify(&pay(), row("CREATED", 3), None),
            Classified::LostRace
        );
    }

    #[test]
    fn bad_rows_are_reported() {
        assert_eq!(
            classify(&pay(), row("PAYED", 1), None),
            Classified::Corrupt(RowProblem::UnknownState("PAYED".into()))
        );
        let mut null_state = row("PAID", 1);
        null_state.state = None;
        assert_eq!(
            classify(&pay(), null_state, None),
            Classified::Corrupt(RowProblem::NullState)
        );
        let mut null_version = row("CREATED", 1);
        null_version.version = None;
        assert_eq!(
            classify(&pay(), null_version, None),
            Classified::Corrupt(RowProblem::NullVersion)
        );
    }
}
