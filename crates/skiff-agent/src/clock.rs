//! The pod worker's time, injected: back-off, probe timing and grace
//! periods read a [`Clock`], so tests move time themselves (a
//! [`ManualClock`]; tokio's paused time would need tokio's `test-util`
//! feature, which rebuilds tokio and all that depends on it for every test
//! build of the workspace).

use std::time::Instant;

/// One reading of the clock: the monotonic instant (for back-off, probe
/// periods and deadlines) and the wall time in nanoseconds since the Unix
/// epoch (the runtime's timestamps and the status' times are wall times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    pub wall_nanos: i64,
}

impl Now {
    /// The wall time as RFC 3339 at whole seconds, as Kubernetes writes
    /// status times.
    pub fn rfc3339(&self) -> String {
        rfc3339(self.wall_nanos)
    }
}

/// A wall time in nanoseconds as RFC 3339 at whole seconds ("" when out
/// of range).
pub fn rfc3339(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .map(|t| {
            t.round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(t)
                .to_string()
        })
        .unwrap_or_default()
}

/// Where the worker reads the time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Now;
}

/// The system's clocks. The monotonic one is tokio's, so a test runtime
/// with paused time moves it.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Now {
        Now {
            at: tokio::time::Instant::now().into_std(),
            wall_nanos: k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
        }
    }
}

/// A clock for tests that moves only when told to, both readings alike
/// (the wall time from a given start).
#[cfg(test)]
pub struct ManualClock {
    start: Instant,
    wall_nanos: i64,
    elapsed: std::sync::Mutex<std::time::Duration>,
}

#[cfg(test)]
impl ManualClock {
    pub fn starting_at(wall_nanos: i64) -> ManualClock {
        ManualClock {
            start: Instant::now(),
            wall_nanos,
            elapsed: Default::default(),
        }
    }

    pub fn advance(&self, by: std::time::Duration) {
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Now {
        let elapsed = *self.elapsed.lock().unwrap_or_else(|e| e.into_inner());
        Now {
            at: self.start + elapsed,
            wall_nanos: self.wall_nanos + elapsed.as_nanos() as i64,
        }
    }
}
