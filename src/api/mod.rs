//! The Foo API and the Deployment it owns: the types, the names and labels
//! they carry, the Deployment as a Foo asks for it and as the caches read
//! it, the labels an operator's shard is chosen by, and the LeaderFence the
//! API server's leader fence reads, and the admission policy that confines
//! the operator's ServiceAccount to the Deployments it builds. No requests here.

pub(crate) mod confinement;
pub(crate) mod constants;
pub(crate) mod deployment;
pub(crate) mod deployment_view;
pub(crate) mod foo;
pub(crate) mod leader_fence;
pub(crate) mod shard;
pub(crate) mod wire;
