//! The per-exec nonce that every step marker carries.
//!
//! A guest program can write anything to stderr, a marker line included.
//! The markers of one exec therefore carry a [`Nonce`]: 128 bits from the
//! operating system's random number generator, drawn for that exec alone.
//! The exec script does not contain it; the host passes it as an argument
//! when the exec starts ([`exec_argv`](super::exec_argv)), so no guest
//! program can know it before, and the rendered script is the same text for
//! every exec of a plan. Lines that look like markers but carry another
//! nonce, or none, are ordinary stderr.

use std::fmt;

/// Hex digits in a nonce's text: 128 bits, two digits a byte.
pub const NONCE_HEX_LEN: usize = 32;

/// The nonce of one exec: 128 random bits, written as
/// [`NONCE_HEX_LEN`] lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce {
    /// The lowercase hex digits, ASCII.
    hex: [u8; NONCE_HEX_LEN],
}

/// The operating system gave no random bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot draw the exec's marker nonce from the operating system's random number generator: {0}; check that getrandom(2) or /dev/urandom works on the node"
)]
pub struct NonceError(String);

impl Nonce {
    /// A fresh nonce from the OS random number generator (`getrandom(2)`).
    pub fn generate() -> Result<Nonce, NonceError> {
        let mut bytes = [0u8; NONCE_HEX_LEN / 2];
        getrandom::fill(&mut bytes).map_err(|e| NonceError(e.to_string()))?;
        Ok(Nonce::from_bytes(bytes))
    }

    /// The nonce of these 16 bytes: for tests and stand-ins of a guest.
    pub fn from_bytes(bytes: [u8; NONCE_HEX_LEN / 2]) -> Nonce {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; NONCE_HEX_LEN];
        for (i, b) in bytes.iter().enumerate() {
            hex[2 * i] = DIGITS[usize::from(b >> 4)];
            hex[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
        }
        Nonce { hex }
    }

    /// The nonce written as `text`: exactly [`NONCE_HEX_LEN`] lowercase hex
    /// digits, else `None`.
    pub fn parse(text: &str) -> Option<Nonce> {
        let hex: [u8; NONCE_HEX_LEN] = text.as_bytes().try_into().ok()?;
        hex.iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(Nonce { hex })
    }

    /// The lowercase hex digits.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.hex).expect("hex digits are ASCII")
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[test]
    fn generated_nonces_are_fresh_hex() {
        let a = Nonce::generate().unwrap();
        let b = Nonce::generate().unwrap();
        assert_ne!(a, b, "two draws of 128 bits do not collide");
        assert_eq!(a.as_str().len(), NONCE_HEX_LEN);
        assert_eq!(Nonce::parse(a.as_str()), Some(a));
    }

    #[test]
    fn bytes_are_written_as_lowercase_hex() {
        let n = Nonce::from_bytes([
            0x00, 0x01, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ]);
        assert_eq!(n.to_string(), "00017f80abcdefff0000000000000010");
        assert_eq!(format!("{n:?}"), "Nonce(00017f80abcdefff0000000000000010)");
    }

    #[rstest]
    #[case::short("0123456789abcdef0123456789abcde")]
    #[case::long("0123456789abcdef0123456789abcdef0")]
    #[case::upper("0123456789ABCDEF0123456789abcdef")]
    #[case::not_hex("0123456789abcdef0123456789abcdeg")]
    #[case::quoted("'0123456789abcdef0123456789abcd'")]
    #[case::empty("")]
    fn only_32_lowercase_hex_digits_parse(#[case] text: &str) {
        assert_eq!(Nonce::parse(text), None);
    }
}
