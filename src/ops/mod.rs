//! The operator's own tools: its command line ([`cli`], [`go_flags`]), the
//! preflight (`sample-controller check`, [`check`]) and the watchdog that
//! says when Foos stop converging ([`watchdog`]).

pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod go_flags;
pub(crate) mod watchdog;
