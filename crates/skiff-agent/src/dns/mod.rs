//! Cluster DNS served by the agent itself: a record index fed by the
//! agent's own watches of Services and EndpointSlices ([`records`]), and
//! the pods' resolv.conf by `dnsPolicy` ([`resolvconf`]).

pub mod records;
pub mod resolvconf;

pub use resolvconf::ClusterDns;
