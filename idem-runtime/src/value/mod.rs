//! The ground floor: the values a call carries to the database, depending on nothing else
//! in the crate — business keys, the values of the columns a handler sets, digests as hex
//! text.

pub(crate) mod column;
pub(crate) mod hex;
pub(crate) mod key;
