//! The operator's own tools: its command line ([`cli`], [`go_flags`]), the
//! preflight (`sample-controller check`, [`check`]), the watchdog that
//! says when Foos stop converging ([`watchdog`]), and the probe that says
//! whether the API server confines the ServiceAccount
//! ([`confinement_probe`]), and the Foos its memory limit holds
//! ([`sizing`]).

pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod confinement_probe;
pub(crate) mod go_flags;
pub(crate) mod sizing;
pub(crate) mod watchdog;
