//! `GET /`: the status page, for a person with a browser rather than a script.
//!
//! One self-contained HTML file (styles and script inline, no external assets, so it works on
//! an isolated network and needs no build step) that reads the same API as everything else:
//! `/v1/masters` for every master, `/v1/events` and the live `/v1/events/stream` for the
//! timeline. It holds no state on the server; compiled in so the binary is all there is to ship.

use axum::http::header;
use axum::response::{Html, IntoResponse};

const PAGE: &str = include_str!("page.html");

/// The inline script and styles are the page's own; nothing may be loaded from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

pub async fn index() -> impl IntoResponse {
    let headers = [
        (header::CACHE_CONTROL, "no-store"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (headers, Html(PAGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for external in ["http://", "https://", "//cdn", "src=\"/", "@import"] {
            assert!(!PAGE.contains(external), "the page refers to {external}");
        }
    }

    /// The page hears a named stream event only if it listens for that name: exactly the
    /// kinds the event log has (it missed eight of them, and listened for four that are none).
    #[test]
    fn the_page_listens_for_every_kind_of_event() {
        let start = PAGE.find("const KINDS = [").expect("the page's list of kinds");
        let list = &PAGE[start..][..PAGE[start..].find("];").expect("the list's end")];
        let listed: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        let kinds: Vec<&str> = crate::events::Kind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(listed, kinds);
    }
}
