//! A handler's transition, resolved and checked at compile time.
//!
//! `#[idempotent]` expands to constants that call the `const fn`s here. A state name the
//! machine does not declare, or a transition it does not allow, makes the constant panic
//! during compilation, so the message below is what the user reads, on their own token.

use crate::machine::definition::{Definition, Machine};

/// One declared transition of a machine: what an `#[idempotent]` handler performs.
///
/// Only a declared transition can be made: with [`idem::transition!`](../idem/macro.transition.html)
/// (checked at compile time) or [`Transition::try_new`].
#[derive(Debug, Clone, Copy)]
pub struct Transition {
    pub(crate) definition: &'static Definition,
    pub(crate) from: usize,
    pub(crate) to: usize,
}

impl Transition {
    /// The transition `from → to` of machine `M`, or why the machine does not declare it
    /// (the message lists what it declares). A `const fn`: `idem::transition!` calls it in
    /// a constant, so that a mistake stops the build.
    ///
    /// ```
    /// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    /// # #[machine(table = "orders", key = "id")]
    /// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
    /// let pay = idem::Transition::try_new::<Order>("CREATED", "PAID").unwrap();
    /// assert_eq!(pay.to_name(), "PAID");
    /// let refused = idem::Transition::try_new::<Order>("PAID", "CREATED").unwrap_err();
    /// assert!(refused.as_str().contains("declares no transition `PAID` -> `CREATED`"));
    /// ```
    // The message is built at compile time, where nothing can be boxed.
    #[allow(clippy::result_large_err)]
    pub const fn try_new<M: Machine>(from: &str, to: &str) -> Result<Transition, TransitionError> {
        let definition = M::DEFINITION;
        if let Some(msg) = state_error(definition, from) {
            return Err(msg);
        }
        if let Some(msg) = state_error(definition, to) {
            return Err(msg);
        }
        if let Some(msg) = transition_error(definition, from, to) {
            return Err(msg);
        }
        Ok(resolve(definition, from, to))
    }

    /// The machine the transition belongs to.
    pub fn definition(&self) -> &'static Definition {
        self.definition
    }

    /// The database name of the source state.
    pub fn from_name(&self) -> &'static str {
        self.definition.states[self.from]
    }

    /// The database name of the target state.
    pub fn to_name(&self) -> &'static str {
        self.definition.states[self.to]
    }
}

/// Resolves `from → to` of a machine, for generated code only (not a public API). Call only
/// after [`state_error`] and [`transition_error`] returned `None` in the same constant
/// evaluation; an unknown name resolves to state 0.
#[doc(hidden)]
pub const fn resolve(definition: &'static Definition, from: &str, to: &str) -> Transition {
    Transition {
        definition,
        from: index_or_zero(definition, from),
        to: index_or_zero(definition, to),
    }
}

/// The compile error for a state name that the machine does not declare.
pub const fn state_error(definition: &Definition, name: &str) -> Option<TransitionError> {
    // No states: the derive failed and reported why at the enum; a second error here
    // ("its states are: " and nothing) would only hide that one.
    if definition.states.is_empty() || find(definition.states, name).is_some() {
        return None;
    }
    let mut msg = TransitionError::new()
        .push("unknown state `")
        .push(name)
        .push("` in state machine `")
        .push(definition.name)
        .push("`; ");
    if let Some(near) = idem_sql::spelling::nearest(name, definition.states) {
        let near = definition.states[near];
        msg = msg.push("did you mean `").push(near).push("`? ");
        if near.len() == name.len() && near.eq_ignore_ascii_case(name) {
            msg = msg.push("State names are case-sensitive. ");
        }
        msg = msg.push("Its states are: ");
    } else {
        msg = msg.push("its states are: ");
    }
    let mut i = 0;
    while i < definition.states.len() {
        if i > 0 {
            msg = msg.push(", ");
        }
        msg = msg.push(definition.states[i]);
        i += 1;
    }
    Some(msg)
}

/// The compile error for a transition that the machine does not declare. `None` when
/// either state is unknown: [`state_error`] reports that.
pub const fn transition_error(
    definition: &Definition,
    from: &str,
    to: &str,
) -> Option<TransitionError> {
    let (Some(f), Some(t)) = (find(definition.states, from), find(definition.states, to)) else {
        return None;
    };
    let mut declared = false;
    let mut targets = TransitionError::new();
    let mut count = 0;
    let mut i = 0;
    while i < definition.transitions.len() {
        let (a, b) = definition.transitions[i];
        if a as usize == f {
            if b as usize == t {
                declared = true;
            }
            if count > 0 {
                targets = targets.push(", ");
            }
            targets = targets.push(definition.states[b as usize]);
            count += 1;
        }
        i += 1;
    }
    if declared {
        return None;
    }
    let msg = TransitionError::new()
        .push("state machine `")
        .push(definition.name)
        .push("` declares no transition `")
        .push(from)
        .push("` -> `")
        .push(to)
        .push("`; ");
    Some(if count == 0 {
        msg.push("`")
            .push(from)
            .push("` is a final state. Declare the transition with `#[state(to(...))]` on the enum if it is legal")
    } else {
        msg.push("from `")
            .push(from)
            .push("` it declares: ")
            .push(targets.as_str())
    })
}

/// The position of the state `name` in the machine's states (generated code only; call
/// after [`state_error`] returned `None`; an unknown name is 0).
#[doc(hidden)]
pub const fn state_index(definition: &Definition, name: &str) -> usize {
    index_or_zero(definition, name)
}

/// The compile error for a creation (`create = "…"`) into a state that is not initial: a
/// row is created only where the workflow starts, so that every later state is reached by
/// its transitions. `None` when the state is unknown: [`state_error`] reports that.
pub const fn creation_error(definition: &Definition, name: &str) -> Option<TransitionError> {
    let Some(state) = find(definition.states, name) else {
        return None;
    };
    let mut i = 0;
    let mut sources = TransitionError::new();
    let mut count = 0;
    while i < definition.transitions.len() {
        let (a, b) = definition.transitions[i];
        if b as usize == state {
            if count > 0 {
                sources = sources.push(", ");
            }
            sources = sources.push(definition.states[a as usize]);
            count += 1;
        }
        i += 1;
    }
    if count == 0 {
        return None;
    }
    Some(
        TransitionError::new()
            .push("`create` makes a row in an initial state, and `")
            .push(name)
            .push("` is reached from ")
            .push(sources.as_str())
            .push(" in state machine `")
            .push(definition.name)
            .push("`; create the row in a state no transition leads to, and move it from there"),
    )
}

/// The compile error for a handler whose `key` names a different number of parameters
/// than the machine has key columns.
pub const fn key_error(definition: &Definition, params: &[&str]) -> Option<TransitionError> {
    let columns = definition.key_columns;
    // No columns: the derive failed and reported why at the enum.
    if columns.is_empty() || columns.len() == params.len() {
        return None;
    }
    let mut msg = TransitionError::new()
        .push("state machine `")
        .push(definition.name)
        .push(if columns.len() == 1 {
            "` is keyed by the column "
        } else {
            "` is keyed by the columns "
        });
    msg = list(msg, columns, "`", "`");
    msg = msg.push(", and `key` names ");
    msg = list(msg, params, "`", "`");
    msg = msg.push(": name one parameter per key column, in that order: `key = ");
    if columns.len() == 1 {
        msg = list(msg, columns, "\"", "\"");
    } else {
        msg = list(msg.push("("), columns, "\"", "\"").push(")");
    }
    Some(msg.push("`"))
}

/// `names`, each between `open` and `close`, separated by commas.
const fn list(
    mut msg: TransitionError,
    names: &[&str],
    open: &str,
    close: &str,
) -> TransitionError {
    let mut i = 0;
    while i < names.len() {
        if i > 0 {
            msg = msg.push(", ");
        }
        msg = msg.push(open).push(names[i]).push(close);
        i += 1;
    }
    msg
}

const fn index_or_zero(definition: &Definition, name: &str) -> usize {
    match find(definition.states, name) {
        Some(i) => i,
        None => 0,
    }
}

const fn find(states: &[&str], name: &str) -> Option<usize> {
    let mut i = 0;
    while i < states.len() {
        if str_eq(states[i], name) {
            return Some(i);
        }
        i += 1;
    }
    None
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Why a machine does not declare a transition: an unknown state or an undeclared
/// transition, with what the machine declares. Built by `const fn`s, so that the same
/// message is the compile error of `idem::transition!` and `#[idempotent]` (a fixed
/// buffer; very long input is cut).
pub struct TransitionError {
    buf: [u8; TransitionError::CAPACITY],
    len: usize,
}

impl TransitionError {
    const CAPACITY: usize = 1024;

    pub(crate) const fn new() -> Self {
        TransitionError {
            buf: [0; TransitionError::CAPACITY],
            len: 0,
        }
    }

    pub(crate) const fn push(mut self, s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() && self.len < TransitionError::CAPACITY {
            self.buf[self.len] = bytes[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// The message text.
    pub const fn as_str(&self) -> &str {
        let (text, _) = self.buf.split_at(self.len);
        match core::str::from_utf8(text) {
            Ok(s) => s,
            Err(_) => "idem: invalid state machine declaration (message cut inside a character)",
        }
    }
}

impl core::fmt::Debug for TransitionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::fmt::Display for TransitionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for TransitionError {}
