//! Hosts reached over OpenSSH, as benchmark rigs are driven.
//!
//! - [`inventory`]: the TOML file that names the hosts (one server host, one or more client
//!   hosts: address, SSH user and port, identity file, CPU lists, where iolab is or
//!   `copy = true`).
//! - [`tiers`]: the TOML file of `iolab tiers up --hosts` (a host per role: client, FE,
//!   IS, BE).
//! - [`ssh`]: one `ssh -o BatchMode=yes ...` command per remote step, every step with a
//!   deadline; remote processes under a lease ([`ssh::Leased`]): the remote side runs the
//!   command in its own session and kills that session when its standard input (the
//!   controller's end of the SSH session) reaches end-of-file, so a controller that dies,
//!   even by SIGKILL, leaves nothing running; the clock offset of a host
//!   ([`ssh::Ssh::clock_offset`]) and its machine description.
//!
//! Nothing here prints; errors name the host and the step.

pub mod inventory;
pub mod ssh;
pub mod tiers;

pub use inventory::{Host, Inventory};
pub use ssh::{Leased, Master, Ssh};
pub use tiers::TiersInventory;
