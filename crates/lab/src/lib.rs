//! The lab: runs the seed's experiments over every model and writes the report.

pub mod cli;
