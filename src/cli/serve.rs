//! `iolab serve` (`iolab models` and `iolab stats` are in [`super::stats`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use iolab_servers::spec::ServeSpec;
use iolab_servers::stats::Stats;
use iolab_servers::Ctx;

use super::{choice_enum, parse_secs};

/// `--model`'s values: the models' own names (`iolab models`), in their order, so a model
/// added to the library is a flag value without a second list here.
fn model_parser() -> impl clap::builder::TypedValueParser<Value = iolab_servers::Model> {
    use clap::builder::TypedValueParser as _;
    use iolab_servers::Model;
    clap::builder::PossibleValuesParser::new(Model::ALL.map(Model::name)).map(|name| {
        *Model::ALL
            .iter()
            .find(|m| m.name() == name)
            .expect("the parser accepts only the models' names")
    })
}

choice_enum! {
    /// How `uring-callback` accepts connections (seed 000's CR vs CR-iocp).
    pub enum AcceptMode => iolab_servers::AcceptMode { Sync, Async }
}

/// Serve a directory over HTTP/1.1 (GET and HEAD) with one I/O model.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Checks that ADDR is free (a port where another server listens is an error, \
even for the models that use SO_REUSEPORT), prints one line, \"serving DIR on ADDR with model \
M (N workers)\", then serves until SIGINT or SIGTERM: the model closes its sockets and the \
process exits with status 0. A second signal exits at once.\n\nExample:\n  iolab serve \
--model epoll --root ./www --addr 127.0.0.1:8080 --stats /tmp/iolab.stats\n  \
curl http://127.0.0.1:8080/index.html\n  iolab stats /tmp/iolab.stats --watch"
)]
pub struct ServeArgs {
    /// The I/O model (see `iolab models`).
    #[arg(long, value_parser = model_parser())]
    pub model: iolab_servers::Model,
    /// Directory to serve; `/` maps to it, a directory to its index.html. Nothing outside it
    /// is ever served (`..`, encoded dots, absolute paths and outward symlinks are refused).
    #[arg(long)]
    pub root: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Threads or loops for the models that have several: thread-pool (pool size, 0 = 256);
    /// epoll and the uring models (one loop or ring per worker, 0 = one per core); runtime
    /// (its worker threads). threads, select and poll ignore it.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Length of the kernel's queue of connections not yet accepted (listen(2) backlog,
    /// capped by net.core.somaxconn).
    #[arg(long, default_value_t = 1024)]
    pub backlog: u32,
    /// Connections held at once; a connection beyond it is closed as soon as it is accepted
    /// and counted as refused.
    #[arg(long, default_value_t = 10_000)]
    pub max_conns: usize,
    /// Seconds a keep-alive connection may wait between requests (or a request body
    /// stall) before the server closes it (counted as a timeout); fractions allowed, 0 =
    /// never.
    #[arg(long, default_value_t = 60.0, value_parser = parse_secs)]
    pub idle_timeout: f64,
    /// Seconds a whole request head may take, from its first byte (from the connection's
    /// start for the first request), however slowly it trickles in (nginx's
    /// client_header_timeout); then the connection is closed, counted as a timeout. 0 =
    /// never.
    #[arg(long, default_value_t = 60.0, value_parser = parse_secs)]
    pub header_timeout: f64,
    /// Seconds a response may wait for the client to take any of its bytes (nginx's
    /// send_timeout); then the connection is closed, counted as a timeout. 0 = never.
    #[arg(long, default_value_t = 60.0, value_parser = parse_secs)]
    pub send_timeout: f64,
    /// Publish the live counters in this shared-memory file, for `iolab stats PATH` and the lab.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// How uring-callback accepts: sync (a blocking accept, seed CR) or async (accepts on the
    /// ring, seed CR-iocp). Others ignore it.
    #[arg(long, value_enum, default_value = "async")]
    pub accept: AcceptMode,
    /// Longest request line; longer is answered 414.
    #[arg(long, default_value_t = iolab_http::Limits::default().max_request_line)]
    pub max_request_line: usize,
    /// Largest header block (request line excluded); larger is answered 431.
    #[arg(long, default_value_t = iolab_http::Limits::default().max_header_bytes)]
    pub max_header_bytes: usize,
    /// Most header lines; more is answered 431.
    #[arg(long, default_value_t = iolab_http::Limits::default().max_headers)]
    pub max_headers: usize,
    /// Largest request body drained before answering; larger is answered 413 and closes.
    #[arg(long, default_value_t = iolab_http::Limits::default().max_body)]
    pub max_body: usize,
    /// Response bytes queued per connection at which the server stops answering (and reading)
    /// pipelined requests until the client has read them: the memory one client can make a
    /// connection hold. Files too large for the cache are streamed in 64 KiB chunks.
    #[arg(long, default_value_t = iolab_http::Limits::default().max_queued)]
    pub max_queued: usize,
    /// Bytes of a connection read at once (each connection's receive buffer), the same in
    /// every model (1 to 16 MiB).
    #[arg(long, default_value_t = iolab_servers::READ_BUF)]
    pub read_buf: usize,
    /// Most response chunks handed to one writev/sendmsg, the same in every model (1 to
    /// 1024).
    #[arg(long, default_value_t = iolab_servers::MAX_IOV)]
    pub max_iov: usize,
    /// uring-fixed: connection slots per worker, each with a --read-buf receive buffer,
    /// allocated and registered (pinned) at start; a connection beyond them is refused. 0 =
    /// --max-conns / workers + 25%, within 256 to 4096 (and at most --max-conns). The start
    /// line says how much memory it pins. Others ignore it.
    #[arg(long, default_value_t = 0)]
    pub slots: usize,
}

impl ServeArgs {
    /// What to serve, as the library's spec (the one the lab launches `iolab serve` with).
    pub fn to_spec(&self) -> ServeSpec {
        ServeSpec {
            model: self.model,
            root: self.root.clone(),
            addr: self.addr,
            workers: self.workers,
            backlog: self.backlog,
            max_conns: self.max_conns,
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
            header_timeout: Duration::from_secs_f64(self.header_timeout),
            send_timeout: Duration::from_secs_f64(self.send_timeout),
            stats: self.stats.clone(),
            accept: self.accept.into(),
            limits: iolab_http::Limits {
                max_request_line: self.max_request_line,
                max_header_bytes: self.max_header_bytes,
                max_headers: self.max_headers,
                max_body: self.max_body,
                max_queued: self.max_queued,
            },
            buffers: iolab_servers::Buffers {
                read_buf: self.read_buf,
                max_iov: self.max_iov,
            },
            slots: self.slots,
        }
    }
}

/// The test hook's `IOLAB_TEST_CPU_PER_REQUEST_US` value, `US` (every model) or `MODEL:US`
/// (that model only: one model of a lab run made slower): the microseconds this model's
/// requests cost more, if any.
fn injected_cost(value: &str, model: &str) -> anyhow::Result<Option<u64>> {
    let (only, us) = match value.rsplit_once(':') {
        Some((m, us)) => (Some(m), us),
        None => (None, value),
    };
    let us: u64 = us.trim().parse().with_context(|| {
        format!("IOLAB_TEST_CPU_PER_REQUEST_US={value:?}: not [MODEL:]MICROSECONDS")
    })?;
    Ok(only.is_none_or(|m| m == model).then_some(us))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let spec = args.to_spec();
    let config = spec.config();
    config.buffers.check().map_err(anyhow::Error::msg)?;
    let model = spec.model;
    // Thousands of connections need descriptors; failure is not fatal (the soft limit stays).
    if let Err(e) = iolab_sys::raise_nofile_limit() {
        tracing::warn!("iolab serve: could not raise RLIMIT_NOFILE: {e}");
    }
    // Before the start line and before the stats file is created (it could be the running
    // server's): a port in use is reported as such, by every model, and nothing else happens.
    // Port 0 passes; the model picks the port when it binds.
    match iolab_servers::net::ensure_addr_free(config.addr) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            anyhow::bail!("{e}: stop that server or choose another --addr")
        }
        Err(e) => return Err(e).context("cannot serve on --addr"),
    }
    let stats = match &spec.stats {
        Some(p) => Stats::create(p)?,
        None => Stats::private(),
    };
    let ctx =
        Ctx::new(config, stats).with_context(|| format!("cannot serve {}", spec.root.display()))?;

    // Test hook, debug builds only: a slow disk (every file read takes this much longer),
    // to watch by hand which models keep serving other connections meanwhile.
    if cfg!(debug_assertions) {
        if let Ok(v) = std::env::var("IOLAB_TEST_READ_DELAY_MS") {
            let ms: u64 = v
                .parse()
                .with_context(|| format!("IOLAB_TEST_READ_DELAY_MS={v:?}: not milliseconds"))?;
            tracing::warn!("test hook: every file read takes {ms} ms longer");
            ctx.site.inject_read_delay(Duration::from_millis(ms));
        }
        // A deliberately slower build of a model, for `lab --compare`'s own test.
        if let Ok(v) = std::env::var("IOLAB_TEST_CPU_PER_REQUEST_US") {
            if let Some(us) = injected_cost(&v, model.name())? {
                tracing::warn!("test hook: every request costs {us} µs more CPU");
                ctx.site.inject_request_cost(Duration::from_micros(us));
            }
        }
    }

    let shutdown = ctx.shutdown.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing the SIGINT/SIGTERM handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0;
            for sig in signals.forever() {
                seen += 1;
                if seen == 1 {
                    shutdown.trigger();
                } else {
                    // A second signal: the user does not want to wait for connections to drain.
                    std::process::exit(128 + sig);
                }
            }
        })?;

    println!(
        "serving {} on {} with model {} ({})",
        ctx.site.root().display(),
        ctx.config.addr,
        model,
        model.workers_line(&ctx.config)
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    model
        .run(&ctx)
        .with_context(|| format!("model {model} on {}", ctx.config.addr))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser as _;
    use iolab_servers::spec::ServeSpec;
    use iolab_servers::{AcceptMode, Model};

    use super::*;

    /// `args` as the binary's command line parses them (the real `iolab` parser, so the
    /// subcommand's name is checked too).
    fn parse(args: Vec<OsString>) -> ServeArgs {
        let cli = crate::Cli::try_parse_from(std::iter::once(OsString::from("iolab")).chain(args))
            .unwrap_or_else(|e| panic!("iolab serve refuses the spec's arguments: {e}"));
        match cli.command {
            crate::Command::Serve(a) => a,
            _ => panic!("not parsed as iolab serve"),
        }
    }

    /// The slower-build hook applies to every model, or to the one it names only.
    #[test]
    fn the_cost_hook_applies_to_the_model_it_names() {
        assert_eq!(injected_cost("40", "epoll").unwrap(), Some(40));
        assert_eq!(injected_cost("epoll:40", "epoll").unwrap(), Some(40));
        assert_eq!(injected_cost("epoll:40", "poll").unwrap(), None);
        assert_eq!(
            injected_cost("uring-callback:7", "uring-callback").unwrap(),
            Some(7)
        );
        assert!(injected_cost("epoll:fast", "epoll").is_err());
        assert!(injected_cost("", "epoll").is_err());
    }

    /// What the lab launches is what `iolab serve` runs: spec -> arguments -> clap -> spec,
    /// for every model and specs that change every field.
    #[test]
    fn a_spec_survives_the_command_line() {
        let addr = "127.0.0.1:8099".parse().unwrap();
        let mut specs: Vec<ServeSpec> = Model::ALL
            .into_iter()
            .map(|m| ServeSpec::new(m, "/srv/www".into(), addr))
            .collect();
        let mut every = ServeSpec::new(Model::UringCallback, "dir with space".into(), addr);
        every.addr = "[::1]:9000".parse().unwrap();
        every.workers = 3;
        every.backlog = 200;
        every.max_conns = 77;
        every.idle_timeout = Duration::from_millis(2500);
        every.header_timeout = Duration::from_millis(1250);
        every.send_timeout = Duration::from_secs(7);
        every.stats = Some("/tmp/iolab stats".into());
        every.accept = AcceptMode::Sync;
        every.limits = iolab_http::Limits {
            max_request_line: 101,
            max_header_bytes: 102,
            max_headers: 103,
            max_body: 104,
            max_queued: 105,
        };
        every.buffers = iolab_servers::Buffers {
            read_buf: 4096,
            max_iov: 8,
        };
        every.slots = 321;
        specs.push(every);
        let mut never_idle = ServeSpec::new(Model::Runtime, "/w".into(), addr);
        never_idle.idle_timeout = Duration::ZERO;
        specs.push(never_idle);
        for spec in specs {
            assert_eq!(parse(spec.to_args()).to_spec(), spec);
        }
    }

    /// `ServeSpec::new` says what `iolab serve` does when a flag is left out.
    #[test]
    fn the_spec_defaults_are_the_command_line_defaults() {
        let args = [
            "serve",
            "--model",
            "epoll",
            "--root",
            "/w",
            "--addr",
            "127.0.0.1:8099",
        ];
        let parsed = parse(args.iter().map(OsString::from).collect()).to_spec();
        let spec = ServeSpec::new(Model::Epoll, "/w".into(), "127.0.0.1:8099".parse().unwrap());
        assert_eq!(parsed, spec);
        assert_eq!(
            parse(
                ["serve", "--model", "epoll", "--root", "/w"]
                    .iter()
                    .map(OsString::from)
                    .collect()
            )
            .addr,
            iolab_servers::Config::default().addr
        );
    }
}
