//! These tests talk to the kernel: they need CAP_NET_ADMIN (root, as CI runs) and
//! CONFIG_INET_DIAG_DESTROY.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};

use std::net::IpAddr;

use super::*;

fn pair(listen: IpAddr, connect: IpAddr) -> (TcpStream, TcpStream, SocketAddr) {
    let listener = TcpListener::bind((listen, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let client = TcpStream::connect((connect, port)).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    (client, server, SocketAddr::new(connect, port))
}

#[test]
fn probe_succeeds_with_the_capability() {
    probe().expect("SOCK_DESTROY works here");
}

#[test]
fn lists_both_ends_of_a_loopback_connection() {
    let (client, _server, server_addr) =
        pair(Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into());
    let local = client.local_addr().expect("addr");
    let all = Diag::open().expect("open").tcp_sockets(States::Established).expect("dump");
    assert!(all.iter().any(|s| s.local == local && s.peer == server_addr));
    assert!(all.iter().any(|s| s.local == server_addr && s.peer == local));
}

#[test]
fn listening_sockets_are_listed_apart_from_connections() {
    let (client, _server, _) = pair(Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into());
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let listening = listener.local_addr().expect("addr");
    let all = Diag::open().expect("open").tcp_sockets(States::Listening).expect("dump");
    assert!(all.iter().any(|s| s.local == listening && s.peer.ip().is_unspecified()));
    let local = client.local_addr().expect("addr");
    assert!(!all.iter().any(|s| s.local == local), "a connection is not a listener");
}

#[test]
fn dual_stack_sockets_are_listed_with_ipv4_addresses() {
    let (client, _server, server_addr) =
        pair(Ipv6Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into());
    let local = client.local_addr().expect("addr");
    let all = Diag::open().expect("open").tcp_sockets(States::Established).expect("dump");
    // The accepted end lives on an IPv6 socket with mapped addresses.
    assert!(all.iter().any(|s| s.local == server_addr && s.peer == local && s.family == AF_INET6));
}

#[test]
fn ipv6_loopback_connections_are_listed() {
    let (client, _server, server_addr) =
        pair(Ipv6Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into());
    let local = client.local_addr().expect("addr");
    let all = Diag::open().expect("open").tcp_sockets(States::Established).expect("dump");
    assert!(all.iter().any(|s| s.local == local && s.peer == server_addr));
}

#[test]
fn destroying_the_server_end_resets_the_client() {
    let (mut client, mut server, server_addr) =
        pair(Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into());
    let peer = client.local_addr().expect("addr");
    let mut diag = Diag::open().expect("open");
    let all = diag.tcp_sockets(States::Established).expect("dump");
    let target = all.iter().find(|s| s.local == server_addr && s.peer == peer).expect("listed");
    assert!(diag.destroy(target).expect("destroy"));
    // Destroying it again: already gone, not an error.
    assert!(!diag.destroy(target).expect("second destroy"));

    let err = client.read(&mut [0u8; 1]).expect_err("reset");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    let err = server.write(b"x").expect_err("aborted");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
}

#[tokio::test]
async fn destroy_where_picks_only_the_selected_sockets() {
    let (_c1, _s1, a1) = pair(Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into());
    let (mut c2, _s2, _a2) = pair(Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into());
    let destroyed =
        destroy_where(States::Established, move |s| s.local == a1).await.expect("sweep");
    assert_eq!(destroyed.len(), 1);
    assert_eq!(destroyed[0].local, a1);
    c2.set_nonblocking(true).expect("nonblocking");
    let still_open = c2.read(&mut [0u8; 1]).expect_err("nothing to read");
    assert_eq!(still_open.kind(), io::ErrorKind::WouldBlock);
}

#[test]
fn garbage_from_the_kernel_is_an_error_not_a_panic() {
    let mut found = Vec::new();
    assert!(read_datagram(&[1, 2, 3], &mut found).is_err());
    assert!(read_datagram(&[255; 40], &mut found).is_err());
    assert!(found.is_empty());
}
