//! First results as stored: JSON text, bounded in size.

use crate::error::Error;

/// The largest first result idem stores, in bytes of JSON (1 MiB). A larger result is
/// refused with [`Error::ResultTooLarge`] before anything commits: first results are
/// replayed to every duplicate, so keep them small (an id, a receipt) and keep large data
/// in tables of your own.
pub const MAX_RESULT_LEN: usize = 1 << 20;

/// `json`, if it fits under [`MAX_RESULT_LEN`].
pub(crate) fn bounded<E>(json: String) -> Result<String, Error<E>> {
    if json.len() > MAX_RESULT_LEN {
        return Err(Error::ResultTooLarge {
            len: json.len(),
            max: MAX_RESULT_LEN,
        });
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_up_to_the_limit_are_stored() {
        let fits = "x".repeat(MAX_RESULT_LEN);
        assert_eq!(bounded::<()>(fits.clone()).unwrap(), fits);
        match bounded::<()>("x".repeat(MAX_RESULT_LEN + 1)) {
            Err(Error::ResultTooLarge { len, max }) => {
                assert_eq!((len, max), (MAX_RESULT_LEN + 1, MAX_RESULT_LEN));
            }
            other => panic!("{other:?}"),
        }
    }
}
