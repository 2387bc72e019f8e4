//! What the fast path keeps of an inbox record (feature `redis`, [`idem::cache`](crate::cache)):
//! under the group and the message key, the payload's digest and the first result, so that
//! a delivery of another payload under the key is left to the database (a conflict).
//! The same for every mode: the transactional stage, the leased claim and its completion.

use super::{Delivery, MessageKey};
use crate::work::fast::CacheKey;
use crate::work::stored::Codec;

/// The key of the message's first result: the group and the message key.
pub(crate) fn key(group: &str, key: &MessageKey) -> CacheKey {
    CacheKey::new("inbox", &[group, key.as_str()])
}

/// The value of a message processed with the first result `json` (`null` for none).
pub(crate) fn value(fingerprint: &str, json: &str) -> String {
    format!("{fingerprint}\n{json}")
}

/// The first result in `value` (`Some(None)`: none stored), if it was written for a
/// delivery of the payload `fingerprint` and decodes.
pub(crate) fn first_result<T>(
    value: &str,
    fingerprint: &str,
    codec: Codec<T>,
) -> Option<Option<T>> {
    let (written_for, json) = value.split_once('\n')?;
    if written_for != fingerprint {
        return None;
    }
    match json {
        "null" => Some(None),
        json => (codec.decode)(json).ok().map(Some),
    }
}

/// The value of `delivery`, if it carries a first result (processed, or a duplicate).
pub(crate) fn of_delivery<T, R>(
    fingerprint: &str,
    delivery: &Delivery<T, R>,
    codec: Codec<T>,
) -> Option<String> {
    let json = match delivery {
        Delivery::Processed(result)
        | Delivery::Duplicate {
            first_result: Some(result),
        } => (codec.encode)(result).ok()?,
        Delivery::Duplicate { first_result: None } => "null".to_owned(),
        _ => return None,
    };
    Some(value(fingerprint, &json))
}
