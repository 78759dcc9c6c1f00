//! The Foo API and the Deployment it owns: the types, the names and labels
//! they carry, the Deployment as a Foo asks for it and as the caches read
//! it, and the labels an operator's shard is chosen by. No requests here.

pub mod constants;
pub mod deployment;
pub mod foo;
pub mod shard;
pub mod wire;
