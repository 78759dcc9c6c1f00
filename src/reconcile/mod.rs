//! The reconcile core: a sync of one Foo. [`decision`] decides what it does
//! (a pure function of the cached objects), [`sync`] reads the caches and
//! makes the plan's writes, [`guard`] gives it a deadline, catches its
//! panics and times its retries, [`context`] is what every sync shares, [`events`] publishes its Events, [`adoption`]
//! takes over the Deployments upstream's controller made, [`error`] is how
//! a sync fails.

pub(crate) mod adoption;
pub(crate) mod context;
pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod guard;
pub(crate) mod sync;
