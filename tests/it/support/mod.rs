//! What the integration tests share: the services' harness (fresh databases and buckets), the
//! rig most tests stand on, the application-side writer, a recording HTTP server, a TCP proxy
//! that can cut the S3 server off, and the independent oracle that reads the lake back.

pub mod harness;
pub mod http;
pub mod oracle;
pub mod proxy;
pub mod rig;
pub mod writer;
