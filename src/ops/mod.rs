//! The operator's own tools: its command line ([`cli`], [`go_flags`]), the
//! preflight (`sample-controller check`, [`check`]) and the watchdog that
//! says when Foos stop converging ([`watchdog`]).

pub mod check;
pub mod cli;
pub mod go_flags;
pub mod watchdog;
