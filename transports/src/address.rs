//! Where a node listens, as an operator names it: an IP address and port, or a host name and
//! port. Kubernetes Services and StatefulSet pods, and Slurm's hosts, are names; a pod that
//! restarts comes back under its name with another IP, so a name is resolved each time a
//! connection is made (TCP) or the peer table is refreshed (UDP), never once for all.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

use thiserror::Error;

/// A node's address: `127.0.0.1:7400`, `[::1]:7400`, or `pserver-server-0.pserver-server:7400`.
///
/// ```
/// use pserver_transport::Address;
/// let ip: Address = "127.0.0.1:7400".parse().unwrap();
/// assert_eq!(ip.port(), 7400);
/// assert!(ip.ip().is_some());
/// let name: Address = "pserver-server-0.pserver-server:7400".parse().unwrap();
/// assert_eq!(name.host(), Some("pserver-server-0.pserver-server"));
/// // A node whose own address is a name listens on every interface, at its port.
/// assert_eq!(name.listen().to_string(), "0.0.0.0:7400");
/// assert!("pserver-server-0".parse::<Address>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Address {
    /// An IP address and port, used as it is.
    Ip(SocketAddr),
    /// A host name and port, resolved when it is used.
    Name {
        /// The host name, in lower case: names are the same in any case, and so are two
        /// addresses that differ only in it.
        host: String,
        /// The port.
        port: u16,
    },
}

/// Why a string is not an [`Address`].
#[derive(Debug, Error, PartialEq, Eq)]
#[error("`{given}` is not an address like 127.0.0.1:7400 or host.name:7400: {why}")]
pub struct AddressError {
    given: String,
    why: &'static str,
}

impl Address {
    /// The port.
    pub fn port(&self) -> u16 {
        match self {
            Address::Ip(a) => a.port(),
            Address::Name { port, .. } => *port,
        }
    }

    /// The IP address and port, if given as such.
    pub fn ip(&self) -> Option<SocketAddr> {
        match self {
            Address::Ip(a) => Some(*a),
            Address::Name { .. } => None,
        }
    }

    /// The host name, if given as one.
    pub fn host(&self) -> Option<&str> {
        match self {
            Address::Ip(_) => None,
            Address::Name { host, .. } => Some(host),
        }
    }

    /// The address a node whose own address this is listens on: the IP address itself, or for
    /// a name every IPv4 interface at its port (the name's record may not exist yet when the
    /// node starts, as with a pod that is not ready, and it may change while the node runs).
    pub fn listen(&self) -> SocketAddr {
        match self {
            Address::Ip(a) => *a,
            Address::Name { port, .. } => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), *port),
        }
    }

    /// The socket addresses it stands for now: itself, or what the system's resolver (the
    /// hosts file, DNS) says the name is at this moment.
    #[cfg(not(loom))]
    pub async fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        match self {
            Address::Ip(a) => Ok(vec![*a]),
            Address::Name { host, port } => {
                let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), *port))
                    .await?
                    .collect();
                if found.is_empty() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{host} resolves to no address"),
                    ));
                }
                Ok(found)
            }
        }
    }
}

impl From<SocketAddr> for Address {
    fn from(a: SocketAddr) -> Self {
        Address::Ip(a)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Ip(a) => write!(f, "{a}"),
            Address::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |why| AddressError {
            given: s.to_owned(),
            why,
        };
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Address::Ip(a));
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(|| fail("no :port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| fail("the port is not a number below 65536"))?;
        if host.is_empty() || host.len() > 253 {
            return Err(fail("a host name has 1 to 253 characters"));
        }
        if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Err(fail("an IPv6 address goes in brackets, like [::1]:7400"));
        }
        // RFC 1123 names; `_` too, which some resolvers accept and service records use.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !host.trim_end_matches('.').split('.').all(label_ok) {
            return Err(fail(
                "a host name is dot-separated labels of letters, digits and -",
            ));
        }
        Ok(Address::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_ip_literals_or_host_names_with_a_port() {
        let v6: Address = "[::1]:7400".parse().unwrap();
        assert_eq!(v6.ip().map(|a| a.port()), Some(7400));
        let name: Address = "localhost:7400".parse().unwrap();
        assert_eq!(name.to_string(), "localhost:7400");
        for bad in [
            "localhost",
            ":7400",
            "host:99999",
            "host name:7400",
            "-host:7400",
            "::1:7400",
            "a..b:7400",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
        let upper: Address = "LOCALHOST:7400".parse().unwrap();
        assert_eq!(upper, name);
        assert_ne!(upper, "localhost:7401".parse().unwrap());
    }

    #[cfg(not(loom))]
    #[tokio::test]
    async fn a_name_resolves_each_time_and_an_unknown_one_says_so() {
        let name: Address = "localhost:7400".parse().unwrap();
        let found = name.resolve().await.unwrap();
        assert!(
            found
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 7400)
        );
        let unknown: Address = "no-such-host.invalid:7400".parse().unwrap();
        assert!(unknown.resolve().await.is_err());
    }
}
