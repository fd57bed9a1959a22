//! Reading SAC's interface listing: the matches of
//! `Net:\s+(\d+),\s+Ip=(\S+)` in the answer to `i` (spec section 10, step
//! 4), hand-written so that the crate needs no regular-expression engine.
//!
//! The classes are those of the expression as upstream evaluates it (RE2):
//! `\s` is one of tab, LF, form feed, CR and space; `\d` an ASCII digit;
//! `\S` any other byte. Matches do not overlap and are found left to right,
//! as a regular-expression search finds them. The work is linear in the
//! answer's length, and the answer is at most
//! [`crate::Budgets::answer_max`] bytes (64 KiB).

use std::collections::HashSet;

/// One match: a net number and the address listed for it. An interface
/// with an IPv4 and an IPv6 address is listed once for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// SAC's interface number, the first argument of a set line.
    pub net: u32,
    /// Exactly the bytes after `Ip=` up to the next whitespace (lossily
    /// decoded: an address that is not UTF-8 matches no [`std::net`]
    /// address anyway).
    pub address: String,
}

const NET: &[u8] = b"Net:";
const IP: &[u8] = b"Ip=";

/// Every listing in `answer`, in order.
///
/// A match whose net number does not fit a `u32` (more than 4294967295,
/// however many leading zeros) is no interface: it is skipped, and the
/// search goes on after it.
pub fn listings(answer: &[u8]) -> Vec<Listing> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = find(&answer[at..], NET) {
        let start = at + offset;
        match match_rest(answer, start + NET.len()) {
            Some((listing, end)) => {
                found.extend(listing);
                at = end;
            }
            None => at = start + 1,
        }
    }
    found
}

/// The interfaces: net numbers in order of first appearance, without
/// repeats. Position `i` is the NIC at position `i` of the VM record (spec
/// section 10, step 5).
pub fn interfaces(listings: &[Listing]) -> Vec<u32> {
    let mut seen = HashSet::new();
    listings
        .iter()
        .map(|l| l.net)
        .filter(|net| seen.insert(*net))
        .collect()
}

/// Whether one listing pairs `net` with exactly `address`.
pub fn lists(listings: &[Listing], net: u32, address: &str) -> bool {
    listings
        .iter()
        .any(|l| l.net == net && l.address == address)
}

/// RE2's `\s`.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ')
}

/// The expression after `Net:`, from `at`: the listing (`None` when the net
/// number overflows) and the match's end, or `None` when nothing matches
/// here.
fn match_rest(s: &[u8], at: usize) -> Option<(Option<Listing>, usize)> {
    let mut i = skip(s, at, is_space)?;
    let digits_start = i;
    let mut net: Option<u32> = Some(0);
    while let Some(&b) = s.get(i).filter(|b| b.is_ascii_digit()) {
        net = net
            .and_then(|n| n.checked_mul(10))
            .and_then(|n| n.checked_add(u32::from(b - b'0')));
        i += 1;
    }
    if i == digits_start || s.get(i) != Some(&b',') {
        return None;
    }
    i = skip(s, i + 1, is_space)?;
    if !s[i..].starts_with(IP) {
        return None;
    }
    let address_start = i + IP.len();
    let end = skip(s, address_start, |b| !is_space(b))?;
    let listing = net.map(|net| Listing {
        net,
        address: String::from_utf8_lossy(&s[address_start..end]).into_owned(),
    });
    Some((listing, end))
}

/// The end of the run of bytes from `at` that satisfy `class`; `None` when
/// the run is empty (the `+` of the expression needs one).
fn skip(s: &[u8], at: usize, class: impl Fn(u8) -> bool) -> Option<usize> {
    let run = s.get(at..)?.iter().take_while(|b| class(**b)).count();
    (run > 0).then_some(at + run)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn pairs(answer: &[u8]) -> Vec<(u32, String)> {
        listings(answer)
            .into_iter()
            .map(|l| (l.net, l.address))
            .collect()
    }

    #[rstest]
    #[case::real_listing(
        b"i\r\nNet: 7, Ip=10.88.0.12  Subnet=255.255.255.0  Gateway=10.88.0.1\r\n\
          Net: 7, Ip=fe80::1c2d:3eff:fe4f:5061\r\n\
          Net: 9, Ip=169.254.10.3  Subnet=255.255.0.0  Gateway=\r\n\r\nSAC>",
        &[(7, "10.88.0.12"), (7, "fe80::1c2d:3eff:fe4f:5061"), (9, "169.254.10.3")]
    )]
    #[case::ipv6_only(b"Net: 7, Ip=fe80::1\r\n", &[(7, "fe80::1")])]
    #[case::ipv6_with_zone(b"Net: 3, Ip=fe80::1%12 ", &[(3, "fe80::1%12")])]
    #[case::any_whitespace_runs(b"Net:\t 7,\r\n\x0c Ip=1.2.3.4", &[(7, "1.2.3.4")])]
    #[case::address_at_end(b"Net: 1, Ip=a", &[(1, "a")])]
    #[case::two_on_a_line(b"Net: 1, Ip=a Net: 2, Ip=b", &[(1, "a"), (2, "b")])]
    #[case::greedy_address(b"Net: 1, Ip=aNet: 2, Ip=b", &[(1, "aNet:")])]
    #[case::inside_a_word(b"XNet: 4, Ip=x", &[(4, "x")])]
    #[case::retry_after_false_start(b"Net: Net: 5, Ip=y", &[(5, "y")])]
    #[case::leading_zeros(b"Net: 007, Ip=1.1.1.1", &[(7, "1.1.1.1")])]
    #[case::largest_net(b"Net: 4294967295, Ip=z", &[(4294967295, "z")])]
    #[case::net_overflows(b"Net: 4294967296, Ip=z Net: 2, Ip=w", &[(2, "w")])]
    #[case::huge_digit_run(
        b"Net: 99999999999999999999999999999999999999999999999999, Ip=z\r\nNet: 3, Ip=q",
        &[(3, "q")]
    )]
    #[case::not_utf8(b"Net: 6, Ip=\xff\xfe", &[(6, "\u{fffd}\u{fffd}")])]
    #[case::no_space_after_colon(b"Net:7, Ip=1.2.3.4", &[])]
    #[case::no_space_after_comma(b"Net: 7,Ip=1.2.3.4", &[])]
    #[case::no_digits(b"Net: , Ip=1.2.3.4", &[])]
    #[case::sign(b"Net: -7, Ip=1.2.3.4", &[])]
    #[case::no_comma(b"Net: 7 Ip=1.2.3.4", &[])]
    #[case::empty_address(b"Net: 7, Ip= Subnet=1", &[])]
    #[case::empty_address_at_end(b"Net: 7, Ip=", &[])]
    #[case::partial_line(b"Net: 7, I", &[])]
    #[case::only_prefix(b"Net:", &[])]
    #[case::lower_case(b"net: 7, ip=1.2.3.4", &[])]
    #[case::vertical_tab_is_not_space(b"Net:\x0b7, Ip=1.2.3.4", &[])]
    #[case::nbsp_is_not_space("Net:\u{a0}7, Ip=1.2.3.4".as_bytes(), &[])]
    #[case::garbage(b"\x00\xff SAC> Net Net; Ip= ,,, \r\n\r\n", &[])]
    #[case::empty(b"", &[])]
    fn matcher(#[case] answer: &[u8], #[case] want: &[(u32, &str)]) {
        let want: Vec<(u32, String)> = want.iter().map(|(n, a)| (*n, a.to_string())).collect();
        assert_eq!(pairs(answer), want);
    }

    #[test]
    fn long_runs_do_not_match_and_stay_linear() {
        let mut answer = b"Net:".to_vec();
        answer.extend(std::iter::repeat_n(b' ', 64 * 1024));
        answer.extend(b"Net: 1, Ip=a");
        assert_eq!(pairs(&answer), vec![(1, "a".to_string())]);
        let flood = b"Net: 1".repeat(10_000);
        assert!(listings(&flood).is_empty());
    }

    #[rstest]
    #[case::first_appearance(&[7, 7, 9, 3, 9], &[7, 9, 3])]
    #[case::one(&[5], &[5])]
    #[case::none(&[], &[])]
    fn interface_order(#[case] nets: &[u32], #[case] want: &[u32]) {
        let listed: Vec<Listing> = nets
            .iter()
            .map(|&net| Listing {
                net,
                address: "a".into(),
            })
            .collect();
        assert_eq!(interfaces(&listed), want);
    }

    #[rstest]
    #[case::exact(7, "10.88.0.12", true)]
    #[case::other_net(9, "10.88.0.12", false)]
    #[case::prefix_of_listed(7, "10.88.0.1", false)]
    #[case::ipv6_entry(7, "fe80::1", true)]
    fn lists_pairs_exactly(#[case] net: u32, #[case] address: &str, #[case] want: bool) {
        let listed = listings(b"Net: 7, Ip=10.88.0.12  Subnet=x\r\nNet: 7, Ip=fe80::1\r\n");
        assert_eq!(lists(&listed, net, address), want);
    }
}
