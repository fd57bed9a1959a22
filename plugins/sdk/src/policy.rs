//! Constructors for [`GuestPolicy`]: what a plugin's plans may do in the
//! guest.
//!
//! Start from [`GuestPolicy::new`] (nothing allowed) and add what the plans
//! need; [`GuestPolicy::with`] joins the policies of the helpers a plugin
//! uses ([`linux::prelude_policy`](crate::linux::prelude_policy),
//! [`networkd::policy`](crate::networkd::policy)).
//!
//! Patterns are absolute paths; `*` matches within one component and a
//! last component `**` matches everything below a directory. A run rule is
//! an argv matched exactly, except that a last element `*` allows any
//! further arguments. The contract (`wit/0.4.0/fixup.wit`, interface
//! `policy`) has the full rules.

use crate::GuestPolicy;

impl GuestPolicy {
    /// A policy that allows nothing.
    pub fn new() -> Self {
        GuestPolicy {
            writes: Vec::new(),
            removes: Vec::new(),
            runs: Vec::new(),
            special_modes: false,
            links: Vec::new(),
        }
    }

    /// Also allow writing files that match these patterns.
    #[must_use]
    pub fn writes<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.writes.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Also allow removing files that match these patterns.
    #[must_use]
    pub fn removes<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.removes.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Also allow these commands (a last `"*"` leaves the rest of the
    /// arguments open).
    #[must_use]
    pub fn runs<A, S>(mut self, rules: impl IntoIterator<Item = A>) -> Self
    where
        A: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.runs.extend(
            rules
                .into_iter()
                .map(|argv| argv.into_iter().map(Into::into).collect()),
        );
        self
    }

    /// Allow modes with bits outside 0o755 (group or other write, setuid,
    /// setgid, sticky). Few plugins need it; operators see it.
    #[must_use]
    pub fn special_modes(mut self) -> Self {
        self.special_modes = true;
        self
    }

    /// Also allow `name-link` steps to give these interface names: a name
    /// where `*` matches any run of characters (`"eth*"`).
    #[must_use]
    pub fn links<S: Into<String>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.links.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// Everything `self` or `other` allows, without repeats.
    #[must_use]
    pub fn with(mut self, other: GuestPolicy) -> Self {
        fn join<T: PartialEq>(into: &mut Vec<T>, from: Vec<T>) {
            for item in from {
                if !into.contains(&item) {
                    into.push(item);
                }
            }
        }
        join(&mut self.writes, other.writes);
        join(&mut self.removes, other.removes);
        join(&mut self.runs, other.runs);
        join(&mut self.links, other.links);
        self.special_modes |= other.special_modes;
        self
    }
}

impl Default for GuestPolicy {
    fn default() -> Self {
        GuestPolicy::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_collect_and_with_joins_without_repeats() {
        let a = GuestPolicy::new().writes(["/etc/hostname"]).runs([[
            "systemctl",
            "restart",
            "systemd-networkd",
        ]]);
        let b = GuestPolicy::new()
            .writes(["/etc/hostname", "/etc/x"])
            .removes(["/etc/y-*"])
            .links(["eth*"])
            .special_modes();
        let joined = a.with(b);
        assert_eq!(joined.writes, ["/etc/hostname", "/etc/x"]);
        assert_eq!(joined.removes, ["/etc/y-*"]);
        assert_eq!(
            joined.runs,
            [vec![
                "systemctl".to_owned(),
                "restart".into(),
                "systemd-networkd".into()
            ]]
        );
        assert_eq!(joined.links, ["eth*"]);
        assert_eq!(
            joined
                .clone()
                .with(GuestPolicy::new().links(["eth*"]))
                .links,
            ["eth*"]
        );
        assert!(joined.special_modes);
        assert_eq!(GuestPolicy::default(), GuestPolicy::new());
    }
}
