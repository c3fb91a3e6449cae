//! DISC (seed 004, chapter 3): the back end (BE) sends a final payload straight onto the
//! client's TCP connection owned by the front end (FE); only headers travel the normal path.
//!
//! Layers, bottom up:
//! - [`proto`]: the DISC header (`X-Disc-Path` on requests: NB_TIER and the BYPASSED_TIERS
//!   bitmap; `X-Disc` on responses: payload id, size, last server) and the policy;
//! - [`http1`]: buffered HTTP/1.1 head reading and body framing on iolab-runtime streams;
//! - [`be`], [`proxy`], [`dp`]: our tiers — BE (static files through iolab-http), FE and IS
//!   (one reverse proxy, its place in the chain told by its role), DP (the BE's payload
//!   store and control endpoint);
//! - [`deadline`]: the head and send deadlines of a tier's client connections;
//! - [`netns`]: running a tier's loop inside a network namespace (tests, CLI);
//! - [`sockopt`]: socket options as plain bytes;
//! - [`repair`]: a TCP connection continued on another socket (`TCP_REPAIR`; not used yet);
//!
//! The command line (`iolab disc ...`) lives in the `iolab` binary.

pub mod be;
pub mod bpf;
pub mod chain;
pub mod control;
pub mod deadline;
pub mod dp;
pub mod gso;
pub mod http1;
pub mod netns;
pub mod packet;
pub mod payload;
pub mod proto;
pub mod proxy;
pub mod repair;
pub mod sender;
pub mod slots;
pub mod sockopt;
pub mod stop;
pub mod store;
pub mod tap;
pub mod xdp;
