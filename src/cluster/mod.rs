//! The cluster of meshpilot processes: etcd, leader election among ingest nodes, membership of
//! frontends, and which frontend owns which proxy.

pub mod election;
pub mod etcd;
pub mod membership;
pub mod metrics;
pub mod ownership;
