//! A handler's transition, resolved and checked at compile time.
//!
//! `#[idempotent]` expands to constants that call the `const fn`s here. A state name the
//! machine does not declare, or a transition it does not allow, makes the constant panic
//! during compilation, so the message below is what the user reads, on their own token.

use crate::machine::{Definition, Machine};

/// One declared transition of a machine: what an `#[idempotent]` handler performs.
#[derive(Debug, Clone, Copy)]
pub struct Transition {
    /// The machine the transition belongs to.
    pub definition: &'static Definition,
    /// Index of the source state in [`Definition::states`].
    pub from: usize,
    /// Index of the target state in [`Definition::states`].
    pub to: usize,
}

impl Transition {
    /// The transition `from → to` of machine `M`, checked at compile time when used in a
    /// `const`: an unknown state or an undeclared transition stops the build with a
    /// message that lists what the machine declares.
    ///
    /// ```
    /// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    /// # #[machine(table = "orders", key = "id")]
    /// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
    /// const PAY: idem::Transition = idem::Transition::new::<Order>("CREATED", "PAID");
    /// assert_eq!(PAY.to_name(), "PAID");
    /// ```
    ///
    /// # Panics
    /// If either state is unknown or the transition is not declared (at compile time in a
    /// `const`).
    pub const fn new<M: Machine>(from: &str, to: &str) -> Transition {
        let definition = M::DEFINITION;
        if let Some(msg) = state_error(definition, from) {
            panic!("{}", msg.as_str());
        }
        if let Some(msg) = state_error(definition, to) {
            panic!("{}", msg.as_str());
        }
        if let Some(msg) = transition_error(definition, from, to) {
            panic!("{}", msg.as_str());
        }
        resolve(definition, from, to)
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

/// Resolves `from → to` of a machine. Call only after [`state_error`] and
/// [`transition_error`] returned `None`; an unknown name resolves to state 0.
pub const fn resolve(definition: &'static Definition, from: &str, to: &str) -> Transition {
    Transition {
        definition,
        from: index_or_zero(definition, from),
        to: index_or_zero(definition, to),
    }
}

/// The compile error for a state name that the machine does not declare.
pub const fn state_error(definition: &Definition, name: &str) -> Option<Message> {
    // No states: the derive failed and reported why at the enum; a second error here
    // ("its states are: " and nothing) would only hide that one.
    if definition.states.is_empty() || find(definition.states, name).is_some() {
        return None;
    }
    let mut msg = Message::new()
        .push("unknown state `")
        .push(name)
        .push("` in state machine `")
        .push(definition.name)
        .push("`; its states are: ");
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
pub const fn transition_error(definition: &Definition, from: &str, to: &str) -> Option<Message> {
    let (Some(f), Some(t)) = (find(definition.states, from), find(definition.states, to)) else {
        return None;
    };
    let mut declared = false;
    let mut targets = Message::new();
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
    let msg = Message::new()
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

/// A compile-time error message built by `const fn`s (a fixed buffer; long input is cut).
pub struct Message {
    buf: [u8; Message::CAPACITY],
    len: usize,
}

impl Message {
    const CAPACITY: usize = 1024;

    const fn new() -> Self {
        Message {
            buf: [0; Message::CAPACITY],
            len: 0,
        }
    }

    const fn push(mut self, s: &str) -> Self {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() && self.len < Message::CAPACITY {
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

impl core::fmt::Debug for Message {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
