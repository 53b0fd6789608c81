//! The process's own limits, set at start: the open-file soft limit raised to the hard
//! limit, so that the caps of the listeners (16,384 HTTP connections, 1,024 DNS TCP
//! connections per listener, the Sentinel and node connections) are what bounds polestar,
//! not a soft limit of 1,024 that a shell or an init system left behind.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises `RLIMIT_NOFILE`'s soft limit to its hard limit; returns the limit now in force.
/// A failure is logged and the start goes on with the limit there was.
pub fn raise_open_files() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return 0;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::debug!(from = soft, to = hard, "open-file soft limit raised");
            hard
        }
        Err(error) => {
            tracing::warn!(%error, soft, hard, "cannot raise the open-file soft limit");
            soft
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("readable");
        assert_eq!(raise_open_files(), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).expect("readable"), (hard, hard));
    }
}
