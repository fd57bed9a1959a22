//! The only lines the pass ever sends to the console, built from validated
//! values (spec section 10, step 3): the empty line that asks for a prompt,
//! `i` that lists the interfaces, and `i <net> <ip> <mask> <gateway>` that
//! sets one. Whatever reaches a [`Line`] is checked once more to hold only
//! the letter `i`, digits, dots and single spaces, so nothing else can ever
//! be typed into the guest's administration console.

use std::net::Ipv4Addr;

/// The longest line: `i 4294967295 255.255.255.255 255.255.255.255
/// 255.255.255.255` is 60 bytes.
const MAX_LINE: usize = 60;

/// A line for the console, without its CR LF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line(String);

impl Line {
    /// The empty line: answered by a `SAC>` prompt once SAC is up.
    pub(crate) fn prompt() -> Line {
        Line::checked(String::new())
    }

    /// `i`: the interface listing.
    pub(crate) fn query() -> Line {
        Line::checked("i".to_owned())
    }

    /// `i <net> <ip> <mask> <gateway>`; without a gateway the last field is
    /// empty and the line ends in a space, as upstream sends it.
    pub(crate) fn set(net: u32, ip: Ipv4Addr, mask: Ipv4Addr, gateway: Option<Ipv4Addr>) -> Line {
        let gateway = gateway.map(|g| g.to_string()).unwrap_or_default();
        Line::checked(format!("i {net} {ip} {mask} {gateway}"))
    }

    /// Panics unless `text` is sendable: a broken invariant of this module,
    /// never a matter of input.
    fn checked(text: String) -> Line {
        assert!(
            sendable(&text),
            "refusing to send {text:?} to SAC: a line holds only `i`, digits, dots and single spaces"
        );
        Line(text)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The bytes on the wire: the line and CR LF.
    pub(crate) fn wire(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.0.len() + 2);
        bytes.extend_from_slice(self.0.as_bytes());
        bytes.extend_from_slice(b"\r\n");
        bytes
    }
}

/// Only `i`, ASCII digits, `.` and spaces, never two spaces in a row, at
/// most [`MAX_LINE`] bytes.
fn sendable(text: &str) -> bool {
    text.len() <= MAX_LINE
        && text
            .bytes()
            .all(|b| b == b'i' || b == b'.' || b == b' ' || b.is_ascii_digit())
        && !text.contains("  ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[test]
    fn lines_on_the_wire() {
        let ip = Ipv4Addr::new(10, 88, 0, 12);
        let mask = Ipv4Addr::new(255, 255, 255, 0);
        let gw = Ipv4Addr::new(10, 88, 0, 1);
        assert_eq!(Line::prompt().wire(), b"\r\n");
        assert_eq!(Line::query().wire(), b"i\r\n");
        assert_eq!(
            Line::set(7, ip, mask, Some(gw)).wire(),
            b"i 7 10.88.0.12 255.255.255.0 10.88.0.1\r\n"
        );
        assert_eq!(
            Line::set(7, ip, mask, None).wire(),
            b"i 7 10.88.0.12 255.255.255.0 \r\n"
        );
    }

    #[test]
    fn longest_line_fits() {
        let all = Ipv4Addr::new(255, 255, 255, 255);
        let line = Line::set(u32::MAX, all, all, Some(all));
        assert_eq!(line.as_str().len(), MAX_LINE);
    }

    #[rstest]
    #[case::empty("", true)]
    #[case::query("i", true)]
    #[case::trailing_space("i 7 1.2.3.4 255.0.0.0 ", true)]
    #[case::double_space("i 7  1.2.3.4", false)]
    #[case::letter("i 7 x", false)]
    #[case::cr("i\r", false)]
    #[case::lf("i\nrestart", false)]
    #[case::colon("i 7 fe80::1", false)]
    #[case::command("cmd", false)]
    #[case::too_long(&"1".repeat(61), false)]
    fn sendable_lines(#[case] text: &str, #[case] ok: bool) {
        assert_eq!(sendable(text), ok);
    }

    #[test]
    #[should_panic(expected = "refusing to send")]
    fn builder_refuses_anything_else() {
        Line::checked("restart".to_owned());
    }
}
