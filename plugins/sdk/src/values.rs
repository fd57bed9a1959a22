//! Text forms of the contract's value types.
//!
//! Addresses print the way guest configuration files expect them: a MAC as
//! lowercase colon-separated hex, an IPv4 address dotted. The WIT enums print
//! their WIT names (`oci-networkd`, `warn`), which is what people see in the
//! host's messages.

use std::fmt;

use crate::{Ipv4Address, LogLevel, MacAddress, Scenario};

impl MacAddress {
    /// Builds an address from its six octets in transmission order.
    pub const fn new(octets: [u8; 6]) -> Self {
        let [a, b, c, d, e, f] = octets;
        Self {
            octets: (a, b, c, d, e, f),
        }
    }

    /// The six octets as an array.
    pub const fn bytes(&self) -> [u8; 6] {
        let (a, b, c, d, e, f) = self.octets;
        [a, b, c, d, e, f]
    }

    /// Twelve lowercase hex digits without separators, as used in networkd
    /// file names (`525400123456`).
    pub fn hex_no_colons(&self) -> String {
        self.bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for MacAddress {
    /// Lowercase hex, colon-separated: `52:54:00:12:34:56`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.bytes();
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Ipv4Address {
    /// Builds an address from its four octets, most significant first.
    pub const fn new(octets: [u8; 4]) -> Self {
        let [a, b, c, d] = octets;
        Self {
            octets: (a, b, c, d),
        }
    }
}

impl fmt::Display for Ipv4Address {
    /// Dotted decimal: `10.0.0.2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c, d) = self.octets;
        write!(f, "{a}.{b}.{c}.{d}")
    }
}

impl Scenario {
    /// The scenario's name in the WIT contract.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Scenario::Cloudimg => "cloudimg",
            Scenario::OciNetworkd => "oci-networkd",
            Scenario::FcMac => "fc-mac",
            Scenario::WindowsPnp => "windows-pnp",
            Scenario::DhcpRecovery => "dhcp-recovery",
            Scenario::Prepare => "prepare",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LogLevel {
    /// The level's name in the WIT contract.
    pub const fn as_str(&self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case([0x52, 0x54, 0x00, 0x12, 0x34, 0x56], "52:54:00:12:34:56", "525400123456")]
    #[case([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF], "aa:bb:cc:dd:ee:ff", "aabbccddeeff")]
    #[case([0, 0, 0, 0, 0, 1], "00:00:00:00:00:01", "000000000001")]
    fn mac_address_text(#[case] octets: [u8; 6], #[case] colons: &str, #[case] bare: &str) {
        let mac = MacAddress::new(octets);
        assert_eq!(mac.to_string(), colons);
        assert_eq!(mac.hex_no_colons(), bare);
        assert_eq!(mac.bytes(), octets);
    }

    #[rstest]
    #[case([10, 0, 0, 2], "10.0.0.2")]
    #[case([0, 0, 0, 0], "0.0.0.0")]
    #[case([255, 255, 255, 255], "255.255.255.255")]
    #[case([192, 168, 100, 1], "192.168.100.1")]
    fn ipv4_address_text(#[case] octets: [u8; 4], #[case] dotted: &str) {
        assert_eq!(Ipv4Address::new(octets).to_string(), dotted);
    }

    #[rstest]
    #[case(Scenario::Cloudimg, "cloudimg")]
    #[case(Scenario::OciNetworkd, "oci-networkd")]
    #[case(Scenario::FcMac, "fc-mac")]
    #[case(Scenario::WindowsPnp, "windows-pnp")]
    #[case(Scenario::DhcpRecovery, "dhcp-recovery")]
    #[case(Scenario::Prepare, "prepare")]
    fn scenario_prints_its_wit_name(#[case] scenario: Scenario, #[case] name: &str) {
        assert_eq!(scenario.to_string(), name);
    }

    #[rstest]
    #[case(LogLevel::Debug, "debug")]
    #[case(LogLevel::Info, "info")]
    #[case(LogLevel::Warn, "warn")]
    #[case(LogLevel::Error, "error")]
    fn log_level_prints_its_wit_name(#[case] level: LogLevel, #[case] name: &str) {
        assert_eq!(level.to_string(), name);
    }
}
