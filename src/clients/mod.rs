//! The protocol clients: services-level, so that both the tools and the
//! channels above them can use one connection to each outside service.

pub mod mqtt;
