//! An inbox record as stored, and what it means for a new delivery.

/// The status column.
pub(crate) const PROCESSING: &str = "PROCESSING";
pub(crate) const SUCCESS: &str = "SUCCESS";
pub(crate) const FAILED: &str = "FAILED";
pub(crate) const DEAD: &str = "DEAD";

/// The columns of a record that classification reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub status: String,
    pub fingerprint: String,
    pub attempts: i64,
    pub result: Option<String>,
    pub error: Option<String>,
    pub lease_until: Option<i64>,
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
    /// Processed before: replay the first result.
    Duplicate(Option<String>),
    /// Parked after its last attempt.
    Dead {
        attempts: i64,
        last_error: Option<String>,
    },
    /// Another delivery holds a live lease.
    InProgress { lease_until: Option<i64> },
    /// A status idem does not know.
    Corrupt(String),
}

pub(crate) fn classify(stored: Stored, fingerprint: &str, now_millis: i64) -> Found {
    if stored.fingerprint != fingerprint {
        return Found::Ended(Ended::Conflict);
    }
    match stored.status.as_str() {
        SUCCESS => Found::Ended(Ended::Duplicate(stored.result)),
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
            status: status.into(),
            fingerprint: "f1".into(),
            attempts: 2,
            result: Some("7".into()),
            error: Some("boom".into()),
            lease_until,
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
            Found::Ended(Ended::Duplicate(Some("7".into())))
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
