//! An inbox record as stored, and what it means for a new delivery.

/// The status column.
pub(crate) const PROCESSING: &str = "PROCESSING";
pub(crate) const SUCCESS: &str = "SUCCESS";
pub(crate) const FAILED: &str = "FAILED";
pub(crate) const DEAD: &str = "DEAD";

/// The columns of a record that classification reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// NULL in no table idem made (the column is NOT NULL), but read as it is.
    pub status: Option<String>,
    /// As the status.
    pub fingerprint: Option<String>,
    pub attempts: i64,
    pub result: Option<String>,
    pub error: Option<String>,
    pub lease_until: Option<i64>,
    /// When it last changed (the database's milliseconds), if the read returned it: what
    /// the age of a cache entry written for it counts from.
    pub updated_at: Option<i64>,
}

/// What a delivery finds when its key is already recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Failed before, or its lease expired: this delivery may try again.
    Retry { attempts: i64, takeover: bool },
    /// Nothing for this delivery to do.
    Ended(Ended),
}

/// A recorded message this delivery leaves alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Same key, different payload: never applied, never merged.
    Conflict,
    /// Processed before: replay the first result. With the record's age in milliseconds at
    /// the read (the database's clock), when the read returned it.
    Duplicate(Option<String>, Option<i64>),
    /// Parked after its last attempt.
    Dead {
        attempts: i64,
        last_error: Option<String>,
    },
    /// Another delivery holds a live lease.
    InProgress { lease_until: Option<i64> },
    /// A status idem does not know, or no status or fingerprint at all (NULL).
    Corrupt(String),
}

impl Ended {
    /// The age of a processed record, when the read returned it: how long a cache entry
    /// written for it may still live is counted from it.
    pub(crate) fn duplicate_age(&self) -> Option<std::time::Duration> {
        match self {
            Ended::Duplicate(_, Some(age)) => u64::try_from(*age)
                .ok()
                .map(std::time::Duration::from_millis),
            _ => None,
        }
    }
}

/// What a delivery of `fingerprint` finds in `stored`, at the database's `now_millis`.
///
/// A record without a fingerprint or a status (NULL, which only a hand-made or altered
/// table can hold) is corrupt: left alone and named, never read as a conflict. A
/// PROCESSING record without a lease is taken over, as one whose lease expired: a lease
/// that never ends would pin the message forever.
pub(crate) fn classify(stored: Stored, fingerprint: &str, now_millis: i64) -> Found {
    let Some(recorded) = stored.fingerprint else {
        return Found::Ended(Ended::Corrupt(
            "no fingerprint (`fingerprint` is NULL)".into(),
        ));
    };
    let Some(status) = stored.status else {
        return Found::Ended(Ended::Corrupt("no status (`status` is NULL)".into()));
    };
    if recorded != fingerprint {
        return Found::Ended(Ended::Conflict);
    }
    match status.as_str() {
        SUCCESS => Found::Ended(Ended::Duplicate(
            stored.result,
            stored
                .updated_at
                .map(|at| now_millis.saturating_sub(at).max(0)),
        )),
        DEAD => Found::Ended(Ended::Dead {
            attempts: stored.attempts,
            last_error: stored.error,
        }),
        PROCESSING if stored.lease_until.is_some_and(|until| until > now_millis) => {
            Found::Ended(Ended::InProgress {
                lease_until: stored.lease_until,
            })
        }
        PROCESSING => Found::Retry {
            attempts: stored.attempts,
            takeover: true,
        },
        FAILED => Found::Retry {
            attempts: stored.attempts,
            takeover: false,
        },
        other => Found::Ended(Ended::Corrupt(format!("unknown status {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(status: &str, lease_until: Option<i64>) -> Stored {
        Stored {
            status: Some(status.into()),
            fingerprint: Some("f1".into()),
            attempts: 2,
            result: Some("7".into()),
            error: Some("boom".into()),
            lease_until,
            updated_at: Some(0),
        }
    }

    #[test]
    fn a_different_payload_is_a_conflict_whatever_the_status() {
        for status in [SUCCESS, PROCESSING, FAILED, DEAD] {
            assert_eq!(
                classify(stored(status, None), "f2", 0),
                Found::Ended(Ended::Conflict)
            );
        }
    }

    #[test]
    fn statuses_mean_what_they_say() {
        assert_eq!(
            classify(stored(SUCCESS, None), "f1", 0),
            Found::Ended(Ended::Duplicate(Some("7".into()), Some(0)))
        );
        assert_eq!(
            classify(stored(DEAD, None), "f1", 0),
            Found::Ended(Ended::Dead {
                attempts: 2,
                last_error: Some("boom".into())
            })
        );
        assert_eq!(
            classify(stored(FAILED, None), "f1", 0),
            Found::Retry {
                attempts: 2,
                takeover: false
            }
        );
        assert_eq!(
            classify(stored("DONE", None), "f1", 0),
            Found::Ended(Ended::Corrupt("unknown status \"DONE\"".into()))
        );
    }

    #[test]
    fn a_record_without_a_fingerprint_or_a_status_is_corrupt_not_a_conflict() {
        for status in [SUCCESS, PROCESSING, FAILED, DEAD] {
            let no_fingerprint = Stored {
                fingerprint: None,
                ..stored(status, None)
            };
            assert_eq!(
                classify(no_fingerprint, "f1", 0),
                Found::Ended(Ended::Corrupt(
                    "no fingerprint (`fingerprint` is NULL)".into()
                ))
            );
        }
        for fingerprint in ["f1", "f2"] {
            let no_status = Stored {
                status: None,
                ..stored(SUCCESS, None)
            };
            assert_eq!(
                classify(no_status, fingerprint, 0),
                Found::Ended(Ended::Corrupt("no status (`status` is NULL)".into()))
            );
        }
    }

    /// A lease that never ends would pin the message forever: taken over.
    #[test]
    fn a_processing_record_without_a_lease_is_taken_over() {
        assert_eq!(
            classify(stored(PROCESSING, None), "f1", 0),
            Found::Retry {
                attempts: 2,
                takeover: true
            }
        );
    }

    #[test]
    fn a_lease_is_live_until_it_expires() {
        assert_eq!(
            classify(stored(PROCESSING, Some(100)), "f1", 99),
            Found::Ended(Ended::InProgress {
                lease_until: Some(100)
            })
        );
        assert_eq!(
            classify(stored(PROCESSING, Some(100)), "f1", 100),
            Found::Retry {
                attempts: 2,
                takeover: true
            }
        );
    }
}
