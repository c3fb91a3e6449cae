//! The table of the server models: their names (as `iolab serve --model` takes them), the
//! seed 000 server each mirrors, and one line on what it is.
//!
//! It lives here, not in `iolab-servers`, so that the lab and `iolab models` can list and
//! check model names without linking the servers. `iolab-servers`' `Model` enum takes its
//! names and descriptions from this table (and its tests check the two agree).

/// One model, as listed by `iolab models`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelInfo {
    /// The name `iolab serve --model` takes (kebab-case).
    pub name: &'static str,
    /// The seed 000 server it mirrors ("-" if none).
    pub seed: &'static str,
    /// What it is, in one line.
    pub what: &'static str,
}

/// Every model, in the order `iolab models` lists them (and `iolab_servers::Model::ALL`).
pub const MODELS: [ModelInfo; 10] = [
    ModelInfo {
        name: "threads",
        seed: "thread",
        what: "an accept thread; one OS thread per connection",
    },
    ModelInfo {
        name: "thread-pool",
        seed: "thread-static",
        what: "N threads started up front, each accept -> serve -> loop; N idle \
               keep-alive clients (256 by default) stop it for --idle-timeout",
    },
    ModelInfo {
        name: "select",
        seed: "select",
        what: "one thread, non-blocking sockets, select(2), FD_SETSIZE enforced",
    },
    ModelInfo {
        name: "poll",
        seed: "-",
        what: "one thread, non-blocking sockets, poll(2)",
    },
    ModelInfo {
        name: "epoll",
        seed: "WSAEventSelect",
        what: "one edge-triggered epoll loop per core",
    },
    ModelInfo {
        name: "uring-accept-sync",
        seed: "iocp1",
        what: "blocking accept in a thread, all other I/O on io_uring",
    },
    ModelInfo {
        name: "uring",
        seed: "iocp2",
        what: "accepts posted ahead, per-connection state machines allocated on demand",
    },
    ModelInfo {
        name: "uring-fixed",
        seed: "iocp3",
        what: "as uring, fixed pre-allocated connection slots, no allocation per request",
    },
    ModelInfo {
        name: "uring-callback",
        seed: "CR / CR-iocp",
        what: "a callback per submission, run by the submitting thread",
    },
    ModelInfo {
        name: "runtime",
        seed: "CPC",
        what: "threaded style on iolab-runtime, one task per connection",
    },
];

/// Default size of the buffer every model reads a connection into (`iolab serve
/// --read-buf`; `iolab_servers::Buffers`). Here, not in the servers, so that the lab records
/// it without linking them.
pub const DEFAULT_READ_BUF: usize = 16 * 1024;

/// Default most response chunks every model hands to one vectored send (`iolab serve
/// --max-iov`).
pub const DEFAULT_MAX_IOV: usize = 64;

/// The model names, in table order.
pub fn names() -> impl Iterator<Item = &'static str> {
    MODELS.iter().map(|m| m.name)
}

/// The entry of a model name, if it is one.
pub fn find(name: &str) -> Option<&'static ModelInfo> {
    MODELS.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_kebab_case() {
        let mut seen = std::collections::BTreeSet::new();
        for m in MODELS {
            assert!(seen.insert(m.name), "{} listed twice", m.name);
            assert!(
                m.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{}",
                m.name
            );
        }
        assert_eq!(find("uring-fixed").unwrap().seed, "iocp3");
        assert!(find("nginx").is_none());
    }
}
