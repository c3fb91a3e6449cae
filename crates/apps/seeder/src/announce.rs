//! Announcing to a torrent's trackers as BEP 12 says: tiers tried in order, the URLs of a
//! tier shuffled once, the first that answers moved to the front of its tier; http:// (BEP
//! 3), https:// (the same over TLS) and udp:// (BEP 15) trackers. A URL of another scheme
//! (wss://) is reported once, when the tiers are made, and never tried.

use std::future::Future;

use crate::https::TlsClient;
use crate::tracker::{self, Announce, AnnounceReply};
use crate::udp_tracker;

/// Peers asked of a tracker per announce (the leechers we may dial).
pub const ANNOUNCE_NUMWANT: usize = 50;

/// The schemes we announce to.
pub fn supported(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://") || url.starts_with("udp://")
}

/// A torrent's trackers as BEP 12 tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    pub tiers: Vec<Vec<String>>,
    /// Whose certificates https:// trackers may show (`None`: Mozilla's roots).
    pub tls: Option<TlsClient>,
}

impl Tiers {
    /// The tiers of `list` with the URLs we cannot announce to left out (each reported
    /// through `skipped`), and each tier shuffled.
    pub fn new(list: Vec<Vec<String>>, mut skipped: impl FnMut(&str)) -> Tiers {
        let mut tiers = Vec::new();
        for tier in list {
            let mut t: Vec<String> = Vec::new();
            for url in tier {
                if supported(&url) {
                    t.push(url);
                } else {
                    skipped(&url);
                }
            }
            for i in (1..t.len()).rev() {
                t.swap(i, rand::random_range(0..=i));
            }
            if !t.is_empty() {
                tiers.push(t);
            }
        }
        Tiers { tiers, tls: None }
    }

    /// These tiers with https:// trackers checked by `tls`.
    pub fn with_tls(self, tls: TlsClient) -> Tiers {
        Tiers {
            tls: Some(tls),
            ..self
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    /// One announce: the URLs tier by tier through `one` until one answers (moved to the
    /// front of its tier); else every URL's error.
    pub async fn announce_with<F, Fut>(&mut self, mut one: F) -> Result<AnnounceReply, Vec<String>>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = anyhow::Result<AnnounceReply>>,
    {
        let mut errors = Vec::new();
        for tier in &mut self.tiers {
            for i in 0..tier.len() {
                match one(tier[i].clone()).await {
                    Ok(r) => {
                        let url = tier.remove(i);
                        tier.insert(0, url);
                        return Ok(r);
                    }
                    Err(e) => errors.push(format!("{e:#}")),
                }
            }
        }
        Err(errors)
    }

    /// One announce of a seeder (`left = 0`) to these tiers.
    pub async fn announce(
        &mut self,
        info_hash: &[u8; 20],
        peer_id: &[u8; 20],
        port: u16,
        uploaded: u64,
        event: &str,
    ) -> Result<AnnounceReply, Vec<String>> {
        let a = Announce {
            info_hash: *info_hash,
            peer_id: *peer_id,
            port,
            left: 0,
            uploaded,
            event: event.to_string(),
            compact: true,
            numwant: ANNOUNCE_NUMWANT,
        };
        let a = &a;
        let tls = self.tls.clone();
        let tls = tls.as_ref();
        self.announce_with(|url| async move {
            if url.starts_with("udp://") {
                udp_tracker::announce(&url, a).await
            } else {
                tracker::announce_over(&url, a, tls).await
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tiers_fall_through_and_the_answering_url_moves_to_the_front() {
        let mut skipped = Vec::new();
        let mut t = Tiers::new(
            vec![
                vec![
                    "http://dead1/a".into(),
                    "wss://x/a".into(),
                    "https://x/a".into(),
                    "http://dead2/a".into(),
                ],
                vec!["ftp://nope".into()],
                vec!["udp://b:1".into(), "http://good/a".into()],
            ],
            |u| skipped.push(u.to_string()),
        );
        assert_eq!(skipped, ["wss://x/a", "ftp://nope"]);
        assert_eq!(t.tiers.len(), 2, "the tier of unsupported URLs is gone");
        let rt = iolab_runtime::Runtime::builder()
            .workers(1)
            .build()
            .unwrap();
        let tried = std::cell::RefCell::new(Vec::new());
        let r = rt.block_on(t.announce_with(|url| {
            tried.borrow_mut().push(url.clone());
            async move {
                if url == "http://good/a" {
                    Ok(AnnounceReply {
                        interval: Duration::from_secs(7),
                        peers: vec![],
                    })
                } else {
                    Err(anyhow::anyhow!("{url} is down"))
                }
            }
        }));
        assert_eq!(r.unwrap().interval, Duration::from_secs(7));
        let tried = tried.into_inner();
        // Both of tier 1 (in either order), then tier 2 until the good one.
        assert!(tried.len() >= 4 && tried.len() <= 5, "{tried:?}");
        assert!(tried[..3].contains(&"http://dead1/a".to_string()));
        assert!(tried[..3].contains(&"https://x/a".to_string()));
        assert_eq!(tried.last().unwrap(), "http://good/a");
        assert_eq!(t.tiers[1][0], "http://good/a", "BEP 12: moved to the front");
        let none = rt.block_on(
            Tiers::new(vec![vec!["http://x".into()]], |_| {}).announce_with(|u| async move {
                Err::<AnnounceReply, _>(anyhow::anyhow!("{u} down"))
            }),
        );
        assert_eq!(none.unwrap_err(), ["http://x down"]);
    }
}
