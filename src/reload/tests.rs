use std::path::Path;

use super::*;

const BASE: &str = "sentinels: { addresses: [\"127.0.0.1:26379\"] }\n\
                    masters: [{ name: a }]\n\
                    http: { listen: \"127.0.0.1:8053\" }\n";

fn parse(text: &str) -> Config {
    Config::parse(text, Path::new("/")).expect("a valid test config")
}

#[test]
fn nothing_changed_is_empty() {
    assert!(Changes::between(&parse(BASE), &parse(BASE)).is_empty());
}

#[test]
fn masters_drain_and_sweep_are_applied_listeners_need_a_restart() {
    let new = BASE.replace("name: a", "name: b").replace("8053", "8054")
        + "drain: { rate: 10 }\nsweep: { local_ports: [6379] }\n";
    let changes = Changes::between(&parse(BASE), &parse(&new));
    assert_eq!(changes.applied, ["masters", "drain", "sweep"]);
    assert_eq!(changes.restart, ["http.listen"]);
    assert!(Changes::watcher(&parse(BASE), &parse(&new)));
}

#[test]
fn drain_alone_leaves_the_watcher_running() {
    let new = format!("{BASE}drain: {{ enabled: false }}\n");
    assert!(!Changes::watcher(&parse(BASE), &parse(&new)));
}

#[test]
fn the_published_config_keeps_the_bound_listeners() {
    let new = BASE.replace("8053", "8054") + "dns: { listen: [\"127.0.0.1:53\"], zone: x. }\n";
    let kept = keep_listeners(&parse(BASE), parse(&new));
    assert_eq!(kept.http.map(|h| h.listen.port()), Some(8053));
    assert_eq!(kept.dns, None);
}

fn reloader(dir: &Path, text: &str) -> (Reloader, ConfigReader) {
    let path = dir.join("polestar.yaml");
    std::fs::write(&path, text).expect("write the config");
    Reloader::new(Config::load(&path).expect("a valid config"))
}

#[test]
fn a_bad_file_is_rejected_and_the_old_config_stays() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (reloader, reader) = reloader(dir.path(), BASE);
    std::fs::write(dir.path().join("polestar.yaml"), "sentinels: 3\nbogus: 1\n").expect("write");
    let error = reloader.reload().expect_err("an invalid file");
    assert!(error.problems().iter().any(|p| p.contains("bogus")), "{error}");
    assert_eq!(reader.borrow().masters, parse(BASE).masters);
    assert!(!reader.has_changed().expect("the reloader is alive"));
}

#[test]
fn a_good_file_is_published() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (reloader, reader) = reloader(dir.path(), BASE);
    let new = BASE.replace("name: a", "name: b");
    std::fs::write(dir.path().join("polestar.yaml"), &new).expect("write");
    let changes = reloader.reload().expect("a valid file");
    assert_eq!(changes.to_string(), "applied masters");
    assert!(reader.has_changed().expect("the reloader is alive"));
    assert_eq!(reader.borrow().masters, parse(&new).masters);
}

#[tokio::test]
async fn a_projection_follows_its_part_only() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (reloader, reader) = reloader(dir.path(), BASE);
    let mut rate = project(&reader, |c| c.drain.rate);
    assert_eq!(*rate.borrow_and_update(), 2000);
    std::fs::write(dir.path().join("polestar.yaml"), format!("{BASE}drain: {{ rate: 7 }}\n"))
        .expect("write");
    reloader.reload().expect("a valid file");
    rate.changed().await.expect("the projection follows");
    assert_eq!(*rate.borrow_and_update(), 7);
}

#[test]
fn sentinel_api_peers_apply_and_its_listener_needs_a_restart() {
    let old = format!(
        "{BASE}sentinel_api: {{ listen: [\"127.0.0.1:26380\"], peers: [\"10.0.0.1:1\"] }}\n"
    );
    let new = old.replace("10.0.0.1:1", "10.0.0.2:1").replace("26380", "26381");
    let changes = Changes::between(&parse(&old), &parse(&new));
    assert_eq!(changes.applied, ["sentinel_api.peers"]);
    assert_eq!(changes.restart, ["sentinel_api.listen"]);
    assert!(!Changes::watcher(&parse(&old), &parse(&new)));
    let kept = keep_listeners(&parse(&old), parse(&new)).sentinel_api.expect("kept");
    assert_eq!(kept.listen[0].port(), 26380, "the bound address stays published");
    assert_eq!(kept.peers[0].host, "10.0.0.2", "the new peers are");
}

/// A reload that turns a section on or off says what that does to its shape: a listener's
/// section waits for a restart (and one turned off keeps serving), `sweep` and `drain` change
/// at once.
#[test]
fn sections_turned_on_or_off_are_named_with_what_happens() {
    let with = format!(
        "{BASE}dns: {{ listen: [\"127.0.0.1:53\"], zone: x. }}\nsweep: {{ remote: true }}\n\
         drain: {{ enabled: false }}\n"
    );
    let on = Changes::between(&parse(BASE), &parse(&with));
    let has = |changes: &Changes, want: &str| changes.turned.iter().any(|t| t.starts_with(want));
    assert!(has(&on, "`dns` turned on: DNS is not served until polestar restarts"), "{on:?}");
    assert!(has(&on, "`sweep` turned on"), "{on:?}");
    assert!(has(&on, "`drain` turned off"), "{on:?}");
    assert_eq!(on.restart, ["dns"]);
    let without_http = with.replace("http: { listen: \"127.0.0.1:8053\" }\n", "");
    let off = Changes::between(&parse(&with), &parse(&without_http));
    assert!(
        has(&off, "`http` turned off: HTTP is still served until polestar restarts"),
        "{off:?}"
    );
    let kept = keep_listeners(&parse(&with), parse(&without_http));
    assert!(kept.http.is_some(), "the running HTTP server stays published");
    assert!(Changes::between(&parse(BASE), &parse(BASE)).turned.is_empty());
}
