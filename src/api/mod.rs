//! The Foo API and the Deployment it owns: the types, the names and labels
//! they carry, the Deployment as a Foo asks for it and as the caches read
//! it, the labels an operator's shard is chosen by, and the LeaderFence the
//! API server's leader fence reads. No requests here.

pub mod constants;
pub mod deployment;
pub mod deployment_view;
pub mod foo;
pub mod leader_fence;
pub mod shard;
pub mod wire;
