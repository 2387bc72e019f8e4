//! "Did you mean": the declared name nearest to a misspelled one.
//!
//! Shared by the macros (argument and parameter names, variants) and by the runtime's
//! compile-time checks (state names, evaluated in a constant), so it is a `const fn` over
//! bytes.
//!
//! A candidate is suggested when it equals the name but for ASCII case, or when their edit
//! distance (insertions, deletions, substitutions and swaps of two neighbours, ignoring
//! case) is at most a third of the longer name, rounded up, and smaller than the shorter
//! one: `PAYED` → `PAID`, `SHIPED` → `SHIPPED`, `orderid` → `order_id`, `form` → `from`, but
//! not `A` → `B`. Of several, the closest wins; of equally close ones, the first.

/// Names longer than this (in bytes) get no suggestion.
pub const MAX_LEN: usize = 64;

/// The index of the candidate nearest to `name`, if one is near enough to suggest.
///
/// ```
/// use idem_sql::spelling::nearest;
/// let states = ["CREATED", "PAID", "SHIPPED", "CANCELLED"];
/// assert_eq!(nearest("created", &states), Some(0));
/// assert_eq!(nearest("PAYED", &states), Some(1));
/// assert_eq!(nearest("SHIPED", &states), Some(2));
/// assert_eq!(nearest("REFUNDED", &states), None);
/// ```
pub const fn nearest(name: &str, candidates: &[&str]) -> Option<usize> {
    let name = name.as_bytes();
    let mut best: Option<usize> = None;
    let mut best_distance = usize::MAX;
    let mut i = 0;
    while i < candidates.len() {
        let candidate = candidates[i].as_bytes();
        if let Some(d) = distance(name, candidate) {
            let longer = if name.len() > candidate.len() {
                name.len()
            } else {
                candidate.len()
            };
            let shorter = name.len() + candidate.len() - longer;
            // Equal but for case (distance 0) is always suggested.
            let near = d == 0 || (d <= longer.div_ceil(3) && d < shorter);
            if near && d < best_distance {
                best = Some(i);
                best_distance = d;
            }
        }
        i += 1;
    }
    best
}

/// The optimal-string-alignment distance of `a` and `b`, ignoring ASCII case; `None` when
/// either is longer than [`MAX_LEN`].
const fn distance(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() > MAX_LEN || b.len() > MAX_LEN {
        return None;
    }
    // Three rows of the dynamic-programming table: i - 2, i - 1 and i.
    let mut before = [0usize; MAX_LEN + 1];
    let mut previous = [0usize; MAX_LEN + 1];
    let mut current = [0usize; MAX_LEN + 1];
    let mut j = 0;
    while j <= b.len() {
        previous[j] = j;
        j += 1;
    }
    let mut i = 1;
    while i <= a.len() {
        current[0] = i;
        let mut j = 1;
        while j <= b.len() {
            let cost = if same(a[i - 1], b[j - 1]) { 0 } else { 1 };
            let mut d = min(
                min(previous[j] + 1, current[j - 1] + 1),
                previous[j - 1] + cost,
            );
            if i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1]) {
                d = min(d, before[j - 2] + 1);
            }
            current[j] = d;
            j += 1;
        }
        before = previous;
        previous = current;
        i += 1;
    }
    Some(previous[b.len()])
}

const fn same(a: u8, b: u8) -> bool {
    a.eq_ignore_ascii_case(&b)
}

const fn min(a: usize, b: usize) -> usize {
    if a < b { a } else { b }
}

#[cfg(test)]
mod tests {
    use super::nearest;

    #[test]
    fn suggests_case_and_small_edits() {
        let states = ["CREATED", "PAID", "SHIPPED", "CANCELLED"];
        assert_eq!(nearest("created", &states), Some(0));
        assert_eq!(nearest("Paid", &states), Some(1));
        assert_eq!(nearest("PAYED", &states), Some(1));
        assert_eq!(nearest("SHIPED", &states), Some(2));
        assert_eq!(nearest("CANCELED", &states), Some(3));
        assert_eq!(nearest("CRAETED", &states), Some(0), "a swap is one edit");
        assert_eq!(nearest("orderid", &["order_id", "amount"]), Some(0));
        assert_eq!(nearest("form", &["machine", "key", "from", "to"]), Some(2));
    }

    #[test]
    fn suggests_nothing_far() {
        let states = ["CREATED", "PAID", "SHIPPED", "CANCELLED"];
        assert_eq!(nearest("REFUNDED", &states), None);
        assert_eq!(nearest("OPEN", &states), None);
        assert_eq!(
            nearest("A", &["B"]),
            None,
            "one letter is not a typo of another"
        );
        assert_eq!(
            nearest("retries", &["machine", "key", "from", "to", "create"]),
            None
        );
        assert_eq!(nearest("id", &["invoice_id"]), None);
        assert_eq!(
            nearest("colour", &["table", "key", "state", "version"]),
            None
        );
        assert_eq!(nearest("", &["A"]), None);
    }

    #[test]
    fn prefers_the_closest_then_the_first() {
        assert_eq!(nearest("PAIDD", &["PAYED", "PAID"]), Some(1));
        assert_eq!(nearest("AB", &["AC", "AD"]), Some(0));
        assert_eq!(
            nearest("paid", &["PAIR", "PAID"]),
            Some(1),
            "case only wins"
        );
    }

    #[test]
    fn long_names_get_no_suggestion() {
        let long = "A".repeat(super::MAX_LEN + 1);
        assert_eq!(nearest(&long, &[long.as_str()]), None);
        let limit = "A".repeat(super::MAX_LEN);
        assert_eq!(nearest(&limit, &[limit.as_str()]), Some(0));
    }

    #[test]
    fn evaluates_in_a_constant() {
        const NEAR: Option<usize> = nearest("PAYED", &["CREATED", "PAID"]);
        assert_eq!(NEAR, Some(1));
    }
}
