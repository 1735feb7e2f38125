//! Conversions between the core's [`Timestamp`] (Unix milliseconds) and the API's time types.
//!
//! Kubernetes stores `metav1.Time` with whole-second precision, so [`Timestamp::to_time`] truncates to
//! the second: a status the step computes must compare equal to the same status read back from the API
//! server, or every step would see a "change" and write again (a hot loop).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff;
use thiserror::Error;

use crate::types::Timestamp;

/// The `netwave.dev/assigned-at` annotation could not be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{value:?} is not an RFC 3339 timestamp: {reason}")]
pub struct TimeError {
    pub value: String,
    pub reason: String,
}

impl Timestamp {
    /// The API time for this instant, truncated to the whole second (what the API server stores).
    /// Saturates at jiff's supported range (years -9999..=9999), far outside any clock we will see.
    pub fn to_time(self) -> Time {
        let secs = self.0.div_euclid(1000);
        let ts = jiff::Timestamp::from_second(secs).unwrap_or(if secs < 0 {
            jiff::Timestamp::MIN
        } else {
            jiff::Timestamp::MAX
        });
        Time(ts)
    }

    /// The instant an API time refers to.
    pub fn from_time(time: &Time) -> Timestamp {
        Timestamp(time.0.as_millisecond())
    }

    /// RFC 3339 text, as written to the `netwave.dev/assigned-at` annotation. Keeps milliseconds, so
    /// [`Timestamp::parse_rfc3339`] gives back exactly the same value.
    pub fn to_rfc3339(self) -> String {
        match jiff::Timestamp::from_millisecond(self.0) {
            Ok(ts) => ts.to_string(),
            Err(_) => self.to_time().0.to_string(),
        }
    }

    /// Parses RFC 3339 text (e.g. the `netwave.dev/assigned-at` annotation).
    pub fn parse_rfc3339(value: &str) -> Result<Timestamp, TimeError> {
        value
            .parse::<jiff::Timestamp>()
            .map(|ts| Timestamp(ts.as_millisecond()))
            .map_err(|e| TimeError {
                value: value.to_string(),
                reason: e.to_string(),
            })
    }

    /// Whole seconds rounded down, as a timestamp (what survives a round trip through the API).
    pub fn truncate_to_secs(self) -> Timestamp {
        Timestamp(self.0.div_euclid(1000) * 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_time_truncates_to_the_second_like_the_api_server() {
        let t = Timestamp(1_700_000_000_999);
        assert_eq!(
            Timestamp::from_time(&t.to_time()),
            Timestamp(1_700_000_000_000)
        );
        let negative = Timestamp(-1);
        assert_eq!(Timestamp::from_time(&negative.to_time()), Timestamp(-1000));
    }

    #[test]
    fn annotation_round_trips_exactly() {
        for ms in [0, 1_700_000_000_000, 1_700_000_000_123] {
            let t = Timestamp(ms);
            assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()), Ok(t));
        }
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T22:13:20Z"),
            Ok(Timestamp(1_700_000_000_000))
        );
        let err = Timestamp::parse_rfc3339("yesterday").unwrap_err();
        assert_eq!(err.value, "yesterday");
    }
}
