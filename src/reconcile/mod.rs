//! The reconcile core: a sync of one Foo. [`decision`] decides what it does
//! (a pure function of the cached objects), [`sync`] reads the caches and
//! makes the plan's writes, [`guard`] gives it a deadline, catches its
//! panics and times its retries, [`context`] is what every sync shares, [`events`] publishes its Events, [`adoption`]
//! takes over the Deployments upstream's controller made, [`error`] is how
//! a sync fails.

pub mod adoption;
pub mod context;
pub mod decision;
pub mod error;
pub mod events;
pub mod guard;
pub mod sync;
