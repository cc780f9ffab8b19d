//! What `[exec] network` comes to on this system: the sandbox's judgement of
//! the setting, next to the jail and the proxy that enforce it.
//!
//! The configuration only reads the setting ([`crate::config::Network`]:
//! `"internet"`, `"lan"`, `"all"`, `"none"`, `"auto"`); what each allows
//! depends on whether this kernel gives the namespace jail and its filtering
//! proxy ([`super::netproxy`]), and that is known here. A filtered setting
//! that cannot be enforced fails closed: no network, not the host's.

use crate::config::Network;

/// What a [`Network`] setting comes to on a system with or without the namespace jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkReach {
    None,
    Filtered { internet: bool, lan: bool },
    All,
}

impl NetworkReach {
    /// What commands get: `Auto` is "internet" with the jail and "all" without it; a
    /// filtered setting without the jail cannot be enforced, so it becomes "none".
    pub fn of(setting: Network, jail: bool) -> NetworkReach {
        match (setting, jail) {
            (Network::None, _) => NetworkReach::None,
            (Network::All, _) | (Network::Auto, false) => NetworkReach::All,
            (Network::Auto, true) => NetworkReach::Filtered { internet: true, lan: false },
            (Network::Filtered { internet, lan }, true) => NetworkReach::Filtered { internet, lan },
            (Network::Filtered { .. }, false) => NetworkReach::None,
        }
    }

    /// For `bramble status` and the startup line.
    pub fn describe(self) -> &'static str {
        match self {
            NetworkReach::None => "no network",
            NetworkReach::All => "the host's whole network (LAN and this machine's own services included)",
            NetworkReach::Filtered { internet: true, lan: false } => {
                "public internet only, through bramble's proxy (no LAN, not this machine)"
            }
            NetworkReach::Filtered { internet: false, lan: true } => {
                "the local network only, through bramble's proxy (not the internet, not this machine)"
            }
            NetworkReach::Filtered { .. } => "internet and local network through bramble's proxy (not this machine)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_comes_to_its_reach_with_and_without_the_jail() {
        assert_eq!(NetworkReach::of(Network::Auto, true), NetworkReach::Filtered { internet: true, lan: false });
        assert_eq!(NetworkReach::of(Network::Auto, false), NetworkReach::All);
        assert_eq!(NetworkReach::of(Network::INTERNET, false), NetworkReach::None, "fails closed");
        assert_eq!(NetworkReach::of(Network::All, true), NetworkReach::All);
    }
}
