//! `iolab tracker`: iolab-seeder's HTTP tracker ([`Tracker`]) on a port until SIGINT or
//! SIGTERM.

use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use iolab_runtime::net::TcpListener;
use iolab_runtime::{sleep, spawn};
use iolab_seeder::tracker::Tracker;
use iolab_seeder::udp_tracker::UdpServer;

use super::seed::{runtime, stop_flag, DriverArg};

/// A small BitTorrent tracker: HTTP (BEP 3 announce, BEP 23 compact, BEP 48 scrape) and
/// UDP (BEP 15) on the same port.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Prints \"tracker on http://ADDR/announce and udp://ADDR\" and serves until \
SIGINT or SIGTERM. Peers announce to /announce, statistics at /scrape (BEP 48).\n\nExample:\n  iolab \
tracker --listen 127.0.0.1:6969"
)]
pub struct TrackerArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "0.0.0.0:6969")]
    pub listen: SocketAddr,
    /// Seconds between a client's announces (told to clients); peers silent for twice this
    /// are forgotten.
    #[arg(long, default_value_t = 60)]
    pub interval: u64,
    #[arg(long, value_enum)]
    pub driver: Option<DriverArg>,
}

pub fn run(args: TrackerArgs) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let rt = runtime(args.driver.map(Into::into))?;
    rt.block_on(async move {
        let listener = TcpListener::bind(args.listen).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                anyhow::anyhow!("cannot listen on {}: the address is in use", args.listen)
            } else {
                anyhow::anyhow!("cannot listen on {}: {e}", args.listen)
            }
        })?;
        let local = listener.local_addr()?;
        // BEP 15 on the same address and port, over UDP.
        let udp = std::net::UdpSocket::bind(local)
            .map_err(|e| anyhow::anyhow!("cannot listen on udp://{local}: {e}"))?;
        println!("tracker on http://{local}/announce and udp://{local}");
        let _ = std::io::stdout().flush();
        let t = Tracker::new(Duration::from_secs(args.interval.max(1)));
        {
            let srv = UdpServer::new(t.clone());
            spawn(async move {
                if let Err(e) = srv.serve(udp).await {
                    eprintln!("tracker: udp serving failed: {e}");
                }
            });
        }
        let failed: Rc<std::cell::RefCell<Option<std::io::Error>>> = Default::default();
        {
            let t = t.clone();
            let f = failed.clone();
            spawn(async move {
                if let Err(e) = t.serve(listener).await {
                    *f.borrow_mut() = Some(e);
                }
            });
        }
        while !stop.load(Ordering::Relaxed) {
            sleep(Duration::from_millis(100)).await;
            if let Some(e) = failed.borrow_mut().take() {
                return Err(anyhow::anyhow!("accepting failed: {e}"));
            }
        }
        eprintln!(
            "tracker: stopped ({} announces, {} scrapes, {} bad requests)",
            t.announces.get(),
            t.scrapes.get(),
            t.bad_requests.get()
        );
        Ok(())
    })
}
