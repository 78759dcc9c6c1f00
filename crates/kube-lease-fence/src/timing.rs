//! The takeover rule and the timing checks, client-go's.

use std::time::Duration;

/// What a candidate does about the Lease it just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseVerdict {
    /// It holds the Lease: renew it.
    Renew,
    /// Nobody holds it (never held, released, or expired): take it.
    Acquire,
    /// Someone else holds it; it expires after this long, unless renewed.
    Wait(Duration),
}

/// The takeover rule, client-go's: `holder` of the Lease as read (empty
/// means released), `unchanged_for` how long its record has been the same
/// on our clock.
pub fn lease_verdict(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> LeaseVerdict {
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h == me => LeaseVerdict::Renew,
        Some(_) if unchanged_for < lease_duration => LeaseVerdict::Wait(lease_duration - unchanged_for),
        _ => LeaseVerdict::Acquire,
    }
}

/// An election timing refused by [`check_timing`], with client-go's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimingError(&'static str);

/// client-go's checks of the election timing (`NewLeaderElector`): the
/// leader must give up before a standby may take over, and retry more than
/// once before giving up; zero would be a tight loop.
/// [`Elector::new`](crate::Elector::new) checks it too.
pub fn check_timing(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), TimingError> {
    // client-go's JitterFactor: a retry waits up to 1.2 retry periods.
    const JITTER_FACTOR: f64 = 1.2;
    if lease_duration.is_zero() {
        return Err(TimingError("leaseDuration must be greater than zero"));
    }
    if renew_deadline.is_zero() {
        return Err(TimingError("renewDeadline must be greater than zero"));
    }
    if retry_period.is_zero() {
        return Err(TimingError("retryPeriod must be greater than zero"));
    }
    if lease_duration <= renew_deadline {
        return Err(TimingError("leaseDuration must be greater than renewDeadline"));
    }
    if renew_deadline.as_secs_f64() <= JITTER_FACTOR * retry_period.as_secs_f64() {
        return Err(TimingError("renewDeadline must be greater than retryPeriod*JitterFactor"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::LEASE;

    #[test]
    fn takeover_rule() {
        let s = Duration::from_secs;
        let table = [
            // (what, holder, unchanged for, verdict)
            ("free: never held", None, s(0), LeaseVerdict::Acquire),
            ("released: holder emptied", Some(""), s(0), LeaseVerdict::Acquire),
            ("ours", Some("me"), s(0), LeaseVerdict::Renew),
            ("ours, even if we have not renewed for long", Some("me"), s(60), LeaseVerdict::Renew),
            ("someone else's, just renewed", Some("other"), s(0), LeaseVerdict::Wait(s(15))),
            ("someone else's, 10 s unchanged", Some("other"), s(10), LeaseVerdict::Wait(s(5))),
            ("someone else's, expired on our clock", Some("other"), s(15), LeaseVerdict::Acquire),
            ("someone else's, long expired", Some("other"), s(600), LeaseVerdict::Acquire),
        ];
        for (what, holder, unchanged_for, want) in table {
            assert_eq!(lease_verdict(holder, "me", unchanged_for, LEASE), want, "{what}");
        }
    }

    #[test]
    fn timing_flags_are_checked_as_client_go_checks_them() {
        let s = Duration::from_secs;
        assert_eq!(check_timing(s(15), s(10), s(2)), Ok(()), "the defaults");
        assert_eq!(check_timing(s(15), s(3), s(2)), Ok(()), "a deadline just over 1.2 retry periods");
        let refused = [
            (s(10), s(10), s(2), "leaseDuration must be greater than renewDeadline"),
            (s(10), s(15), s(2), "leaseDuration must be greater than renewDeadline"),
            (s(15), s(10), s(0), "retryPeriod must be greater than zero"),
            (s(15), s(0), s(2), "renewDeadline must be greater than zero"),
            (s(0), s(10), s(2), "leaseDuration must be greater than zero"),
            (s(15), s(2), s(2), "renewDeadline must be greater than retryPeriod*JitterFactor"),
        ];
        for (lease, renew, retry, message) in refused {
            let refusal = check_timing(lease, renew, retry).map_err(|e| e.to_string());
            assert_eq!(refusal, Err(message.to_owned()), "{lease:?} {renew:?} {retry:?}");
        }
    }
}
