//! The lab itself: the cluster converges, faults do what they say, nothing is left behind.

use std::path::Path;
use std::time::Duration;

use polestar_lab::conf::{self, Listen, Monitor};
use polestar_lab::{
    Flavor, Kind, Lab, LabOptions, Launch, Server, ServerOptions, leftovers, query,
};

const FAILOVER: Duration = Duration::from_secs(30);

async fn lab() -> Lab {
    Lab::start(LabOptions::default()).await.expect("the lab starts")
}

#[tokio::test]
async fn cluster_converges_with_node_0_as_primary() {
    let lab = lab().await;
    let mut nodes = lab.node_addrs();
    assert_eq!(lab.primary().await.expect("primary"), nodes[0]);
    let mut replicas = nodes.split_off(1);
    replicas.sort();
    assert_eq!(lab.replicas().await.expect("replicas"), replicas);
    assert_eq!(lab.epoch().await.expect("epoch"), 0);
    assert_eq!(lab.role(0).await.expect("role"), "master");
    assert_eq!(lab.role(1).await.expect("role"), "slave");
}

#[tokio::test]
async fn failover_changes_the_primary_seen_by_every_sentinel() {
    let lab = lab().await;
    let old = lab.primary().await.expect("primary");
    lab.failover().await.expect("failover accepted");
    let new = lab.wait_for_primary_change(old, FAILOVER).await.expect("new primary");
    assert_ne!(new, old);
    let i = lab.index_of(new).expect("the new primary is a lab node");
    assert!(lab.epoch().await.expect("epoch") > 0);
    let role = lab.wait_for(FAILOVER, "new primary is master", || async {
        let role = lab.role(i).await?;
        anyhow::ensure!(role == "master", "role {role}");
        Ok(role)
    });
    role.await.expect("the promoted node says master");
}

#[tokio::test]
async fn a_second_failover_works_too() {
    let lab = lab().await;
    let first = lab.primary().await.expect("primary");
    lab.failover().await.expect("failover accepted");
    let second = lab.wait_for_primary_change(first, FAILOVER).await.expect("first failover");
    lab.failover().await.expect("second failover accepted");
    let third = lab.wait_for_primary_change(second, FAILOVER).await.expect("second failover");
    assert_ne!(third, second);
}

#[tokio::test]
async fn a_stopped_sentinel_comes_back_on_the_same_port() {
    let lab = lab().await;
    let addr = lab.sentinel_addrs()[1];
    lab.stop_sentinel(1).expect("stop");
    assert!(query::<String>(addr, &redis::cmd("PING")).await.is_err());
    assert!(!lab.running_sentinels().contains(&addr));
    lab.start_sentinel(1).await.expect("start again");
    assert_eq!(lab.sentinel_addrs()[1], addr);
    assert_eq!(lab.primary_per(addr).await.expect("it knows the master"), lab.node_addrs()[0]);
    lab.wait_converged(Duration::from_secs(30)).await.expect("converged again");
}

#[tokio::test]
async fn a_hung_sentinel_is_skipped_and_resumes() {
    let lab = lab().await;
    lab.hang_sentinel(0).expect("hang");
    assert!(lab.primary().await.is_ok(), "the others answer");
    let hung = lab.sentinel_addrs()[0];
    assert!(query::<String>(hung, &redis::cmd("PING")).await.is_err(), "it answers nothing");
    lab.unhang_sentinel(0).expect("resume");
    assert_eq!(query::<String>(hung, &redis::cmd("PING")).await.expect("ping"), "PONG");
}

#[tokio::test]
async fn a_killed_node_restarts_on_its_port() {
    let lab = lab().await;
    let addr = lab.node_addrs()[2];
    lab.kill_node(2).expect("kill");
    assert!(query::<String>(addr, &redis::cmd("PING")).await.is_err());
    lab.restart_node(2).await.expect("restart");
    assert_eq!(query::<String>(addr, &redis::cmd("PING")).await.expect("ping"), "PONG");
}

#[tokio::test]
async fn drop_leaves_no_process_and_no_files() {
    let lab = lab().await;
    lab.stop_node(1).expect("a stopped node is killed too");
    let pids: Vec<u32> =
        (0..3).flat_map(|i| [lab.node_pid(i), lab.sentinel_pid(i)]).flatten().collect();
    assert_eq!(pids.len(), 6);
    let dir = lab.dir().to_owned();
    drop(lab);
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} survived the drop");
    }
    assert!(!dir.exists(), "{} survived the drop", dir.display());
}

#[test]
fn leftovers_of_a_dead_owner_are_killed() {
    let dir =
        std::env::temp_dir().join(format!("{}test-{}", leftovers::PREFIX, std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a fake lab dir");
    // A pid above the kernel's maximum: an owner that is certainly dead.
    std::fs::write(dir.join("owner"), "4294967295 1\n").expect("owner file");
    // Started as a lab starts its processes: working in its directory, no TCP port.
    let listen = Listen { ip: [127, 0, 0, 1].into(), port: 0, dir: dir.clone(), logfile: None };
    let text = conf::common(&listen) + conf::NO_PERSISTENCE;
    let config = conf::write(&dir, Kind::Server, &text).expect("write its config");
    let launch = Launch::server(&Flavor::Redis, Kind::Server, &config);
    let mut orphan = launch.spawn().expect("redis-server starts");
    wait_for_cwd(orphan.id(), &dir);
    leftovers::clean();
    let status = orphan.wait().expect("reaped");
    assert!(!status.success(), "killed, not exited normally: {status}");
    assert!(!dir.exists(), "the stale dir is removed");
}

fn wait_for_cwd(pid: u32, dir: &Path) {
    for _ in 0..100 {
        if std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(dir)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("process {pid} never worked in {}", dir.display());
}

#[tokio::test]
async fn hostnames_mode_converges_and_fails_over() {
    let opts = LabOptions { hostnames: true, ..LabOptions::default() };
    let lab = Lab::start(opts).await.expect("the lab starts with announce-hostnames");
    let fields = lab.replica_fields().await.expect("replicas");
    assert!(fields.iter().all(|r| r.get("ip").is_some_and(|ip| ip == "localhost")), "{fields:?}");
    let old = lab.primary().await.expect("localhost resolves");
    assert_eq!(old, lab.node_addrs()[0]);
    lab.failover().await.expect("failover accepted");
    let new = lab.wait_for_primary_change(old, FAILOVER).await.expect("new primary");
    assert!(lab.index_of(new).is_some());
}

/// A standalone server (the drain tests' nodes, their Sentinel) starts as a lab's processes
/// do: it answers, works in a lab directory (so a dead owner's servers are leftovers), and
/// leaves neither process nor files after its drop.
#[tokio::test]
async fn a_standalone_node_and_its_sentinel_answer_and_leave_nothing_behind() {
    let node = Server::start(ServerOptions::node()).await.expect("a node starts");
    let monitor = Monitor {
        name: "solo".into(),
        host: "127.0.0.1".into(),
        port: node.port(),
        quorum: 1,
        down_after: Duration::from_secs(5),
        failover_timeout: Duration::from_secs(10),
        parallel_syncs: 1,
    };
    let sentinel = Server::start(ServerOptions::sentinel(&monitor)).await.expect("it starts");
    let cmd = redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg("solo").clone();
    let (host, port): (String, u16) = query(sentinel.addr(), &cmd).await.expect("it knows solo");
    assert_eq!((host.as_str(), port), ("127.0.0.1", node.port()));
    let pids = [node.pid().expect("running"), sentinel.pid().expect("running")];
    let dirs = [node.dir().to_owned(), sentinel.dir().to_owned()];
    for (pid, dir) in pids.iter().zip(&dirs) {
        let name = dir.file_name().expect("a name").to_string_lossy().into_owned();
        assert!(name.starts_with(leftovers::PREFIX), "{} is no lab directory", dir.display());
        wait_for_cwd(*pid, dir);
    }
    drop((node, sentinel));
    for (pid, dir) in pids.iter().zip(&dirs) {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} survived the drop");
        assert!(!dir.exists(), "{} survived the drop", dir.display());
    }
}
