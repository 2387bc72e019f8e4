//! Lower-case hex, for digests stored as text.

/// `bytes` as lower-case hex, two characters a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_byte_is_two_lower_case_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::hex(&all), expected);
        assert_eq!(super::hex(&[]), "");
    }
}
