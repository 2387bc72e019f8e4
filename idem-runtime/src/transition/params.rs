//! What the transition stage's statements bind: which statement moves the row (the
//! machine's, or the handler's own when it sets columns; guarded or not) and its
//! parameters, in order — the key's columns, then the rest.

use crate::backend::{Dialect, Param};
use crate::transition::classify::Guard;
use crate::transition::declared::Transition;
use crate::value::column::ColumnValue;
use crate::value::key::Key;

/// One call of the transition stage: what its statements bind.
pub(super) struct Call<'a> {
    pub(super) transition: &'a Transition,
    pub(super) dialect: Dialect,
    pub(super) key: &'a Key,
    pub(super) key_text: &'a str,
    /// The key its first result is stored under: the key's text, and for an event of a
    /// stream its version too.
    pub(super) result_key: &'a str,
    pub(super) guard: Guard,
    /// The handler's own statements and the values of the columns they set, if it sets any.
    pub(super) set: Option<(&'a idem_sql::transition::Statements, &'a [ColumnValue])>,
    /// The first result, to store in the statement that moves the row (PostgreSQL).
    pub(super) storing: Option<&'a str>,
}

impl<'a> Call<'a> {
    /// The statement's parameters: the key's columns, then `rest`.
    pub(super) fn params(&self, rest: &[Param<'a>]) -> Params<'a> {
        let mut params = Params::default();
        key_params(self.key, &mut params);
        for &param in rest {
            params.push(param);
        }
        params
    }

    /// The parameters of a statement that moves the row: [`params`](Self::params), the
    /// guard's version (expected, or the event's), then the values of the columns the
    /// handler sets.
    pub(super) fn update_params(&self, rest: &[Param<'a>]) -> Params<'a> {
        let mut params = self.params(rest);
        match self.guard {
            Guard::Any => {}
            Guard::Expected(v) | Guard::Watermark(v) => params.push(Param::Int(v)),
        }
        for value in self.set.map_or(&[][..], |(_, values)| values) {
            params.push(Param::Column(value));
        }
        params
    }

    /// The statements that move the row: the handler's when it sets columns, else the
    /// machine's.
    pub(super) fn updates(&self) -> Updates<'a> {
        match self.set {
            Some((sql, _)) => Updates {
                transition: [
                    &sql.transition,
                    &sql.transition_guarded,
                    &sql.transition_watermark,
                ],
                update: [&sql.update, &sql.update_guarded, &sql.update_watermark],
                storing: [
                    &sql.transition_storing,
                    &sql.transition_storing_guarded,
                    &sql.transition_storing_watermark,
                ],
            },
            None => {
                let sql = self.transition.definition.sql.of(self.dialect);
                Updates {
                    transition: [
                        sql.transition,
                        sql.transition_guarded,
                        sql.transition_watermark,
                    ],
                    update: [sql.update, sql.update_guarded, sql.update_watermark],
                    storing: [
                        sql.transition_storing,
                        sql.transition_storing_guarded,
                        sql.transition_storing_watermark,
                    ],
                }
            }
        }
    }
}

/// The statements that move a row, each without a guard, with the expected version, with
/// an event's watermark.
pub(super) struct Updates<'a> {
    transition: [&'a str; 3],
    update: [&'a str; 3],
    storing: [&'a str; 3],
}

impl<'a> Updates<'a> {
    fn pick(statements: [&'a str; 3], guard: Guard) -> &'a str {
        match guard {
            Guard::Any => statements[0],
            Guard::Expected(_) => statements[1],
            Guard::Watermark(_) => statements[2],
        }
    }

    /// PostgreSQL's UPDATE that classifies a miss itself.
    pub(super) fn transition(&self, guard: Guard) -> &'a str {
        Self::pick(self.transition, guard)
    }

    /// The plain conditional UPDATE.
    pub(super) fn update(&self, guard: Guard) -> &'a str {
        Self::pick(self.update, guard)
    }

    /// PostgreSQL's UPDATE that also stores the first result.
    pub(super) fn storing(&self, guard: Guard) -> &'a str {
        Self::pick(self.storing, guard)
    }
}

/// A statement's parameters: on the stack for up to [`Params::INLINE`] (a key of up to three
/// columns), so a call allocates nothing for them.
pub(crate) struct Params<'a> {
    inline: [Param<'a>; Params::INLINE],
    len: usize,
    spilled: Vec<Param<'a>>,
}

impl Params<'_> {
    const INLINE: usize = 8;
}

impl Default for Params<'_> {
    fn default() -> Self {
        Params {
            inline: [Param::Null; Params::INLINE],
            len: 0,
            spilled: Vec::new(),
        }
    }
}

impl<'a> Params<'a> {
    pub(crate) fn push(&mut self, param: Param<'a>) {
        if self.len < Params::INLINE {
            self.inline[self.len] = param;
        } else {
            if self.spilled.is_empty() {
                self.spilled.extend_from_slice(&self.inline);
            }
            self.spilled.push(param);
        }
        self.len += 1;
    }
}

impl<'a> core::ops::Deref for Params<'a> {
    type Target = [Param<'a>];

    fn deref(&self) -> &[Param<'a>] {
        if self.len <= Params::INLINE {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }
}

/// The key's columns, in order, as parameters.
pub(crate) fn key_params<'a>(key: &'a Key, params: &mut Params<'a>) {
    match key {
        Key::Int(n) => params.push(Param::Int(*n)),
        Key::Text(s) => params.push(Param::Text(s)),
        #[cfg(feature = "uuid")]
        Key::Uuid(id) => params.push(Param::Uuid(*id)),
        Key::Composite(parts) => {
            for part in parts.parts() {
                key_params(part, params);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(params: &[Param<'_>]) -> Vec<i64> {
        params
            .iter()
            .map(|p| match p {
                Param::Int(n) => *n,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn parameters_stay_in_order_past_the_inline_ones() {
        for n in [0, 1, 8, 9, 20] {
            let mut params = Params::default();
            for i in 0..n {
                params.push(Param::Int(i));
            }
            assert_eq!(ints(&params), (0..n).collect::<Vec<_>>());
        }
    }
}
