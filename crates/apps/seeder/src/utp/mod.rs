//! uTP (BEP 29): BitTorrent over UDP with LEDBAT congestion control.
//!
//! [`packet`] is the codec, [`conn`] one connection as pure code (time passed in),
//! [`ledbat`] its congestion window. The seeder runs them on the runtime
//! (`seed::utp_mux`): one UDP socket on the TCP listener's port, packets routed by
//! (address, connection id), each connection bridged to a peer session.

pub mod conn;
pub mod ledbat;
pub mod packet;

#[cfg(test)]
mod tests;
