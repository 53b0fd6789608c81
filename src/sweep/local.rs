//! This host's addresses: a node is local when its published address is one of them.

use std::net::IpAddr;

/// Whether `ip` is an address of one of this host's interfaces (looked up afresh each time:
/// addresses come and go, and a change of primary is rare).
pub fn is_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs.filter_map(|a| a.address).any(|a| address_of(&a) == Some(ip)),
        Err(e) => {
            tracing::warn!("cannot list this host's addresses: {e}");
            false
        }
    }
}

fn address_of(addr: &nix::sys::socket::SockaddrStorage) -> Option<IpAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(IpAddr::V4(v4.ip()));
    }
    addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()).to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_local_and_a_test_net_address_is_not() {
        assert!(is_local("127.0.0.1".parse().expect("ip")));
        assert!(!is_local("192.0.2.77".parse().expect("ip")));
    }
}
