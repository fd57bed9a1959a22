//! The NICs a pass works on, as the VM record lists them, and the subnet
//! mask a static NIC's prefix stands for.
//!
//! A prefix that cocoon left out, or wrote as 0, is unknown and taken as
//! 24; a prefix outside 1..=32 is invalid input (spec section 2, input
//! normalisation). Both are decided before any byte is sent.

use std::net::Ipv4Addr;

use crate::SacError;

/// The prefix an unknown one is taken as (spec section 2): 24, mask
/// `255.255.255.0`.
pub const DEFAULT_PREFIX: u8 = 24;

/// One entry of the VM record's `network_configs`, in inspect order. Only
/// the position of a DHCP NIC matters to the pass (it pairs NICs with SAC's
/// interfaces by position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nic {
    /// No address in the record: the guest's DHCP client handles it.
    Dhcp,
    /// An address the pass sets through SAC.
    Static(StaticNic),
}

/// A static NIC's values from the VM record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticNic {
    pub ip: Ipv4Addr,
    /// `network.prefix`; `None` when cocoon left it out.
    pub prefix: Option<u8>,
    /// `network.gateway`; `None` when cocoon left it out. The set line then
    /// ends in a space (spec section 10, step 6).
    pub gateway: Option<Ipv4Addr>,
}

impl StaticNic {
    /// The dotted-quad mask for [`StaticNic::prefix`]: see [`prefix_mask`].
    pub fn mask(&self) -> Result<Ipv4Addr, SacError> {
        prefix_mask(self.prefix)
    }
}

const FIX_PREFIX: &str = "correct network.prefix of the NIC in the VM record (`cocoon vm inspect <id> --json`) to a value in 1..=32";

/// The mask for a prefix: `24` → `255.255.255.0`, `32` →
/// `255.255.255.255`, `1` → `128.0.0.0`. `None` or `0` is
/// [`DEFAULT_PREFIX`]; anything above 32 is [`SacError::Invalid`].
pub fn prefix_mask(prefix: Option<u8>) -> Result<Ipv4Addr, SacError> {
    let prefix = match prefix {
        None | Some(0) => DEFAULT_PREFIX,
        Some(p @ 1..=32) => p,
        Some(p) => {
            return Err(SacError::Invalid {
                problem: format!("prefix {p} is outside 1..=32"),
                fix: FIX_PREFIX,
            });
        }
    };
    Ok(Ipv4Addr::from(u32::MAX << (32 - u32::from(prefix))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::missing(None, "255.255.255.0")]
    #[case::zero(Some(0), "255.255.255.0")]
    #[case::one(Some(1), "128.0.0.0")]
    #[case::eight(Some(8), "255.0.0.0")]
    #[case::twenty_three(Some(23), "255.255.254.0")]
    #[case::twenty_four(Some(24), "255.255.255.0")]
    #[case::thirty_one(Some(31), "255.255.255.254")]
    #[case::thirty_two(Some(32), "255.255.255.255")]
    fn masks(#[case] prefix: Option<u8>, #[case] mask: &str) {
        assert_eq!(prefix_mask(prefix).unwrap().to_string(), mask);
    }

    #[rstest]
    #[case(33)]
    #[case(64)]
    #[case(255)]
    fn invalid_prefixes(#[case] prefix: u8) {
        let err = prefix_mask(Some(prefix)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "sac invalid input: prefix {prefix} is outside 1..=32; correct network.prefix of the NIC in the VM record (`cocoon vm inspect <id> --json`) to a value in 1..=32"
            )
        );
    }
}
