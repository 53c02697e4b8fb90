//! Named points where a test build crashes or pauses its own process, so the
//! tests can kill or freeze the real binary at every step of the state
//! table (issue 24): before and after the claim commits, before the request
//! is written, after the provider answered, before and after the final
//! write, during the shutdown drain; and a verification's move to its next
//! channel, before and after its transaction commits (issue 40).
//!
//! Only builds with the `failpoints` feature have them (`scripts/test.sh`
//! builds the test binary so); in every other build [`hit`] is an empty
//! inline function. Configured once per process by `SENDONCE_FAILPOINTS`, a
//! comma-separated list of `name=action`:
//!
//! - `kill`: SIGKILL this process the first time the point is reached
//!   (nothing after it runs: no drop, no flush, no lease release);
//! - `stop`: SIGSTOP this process the first time (a pause: GC, a VM freeze);
//!   it goes on where it was when the test sends SIGCONT.
//!
//! Before acting it writes `failpoint NAME: ACTION` to stderr, so a test can
//! wait for the line rather than guess when the point was reached.

/// Every point, by name (a test that names another is refused at start).
pub const POINTS: &[&str] = &[
    "claim.before",
    "claim.after",
    "call.before_request",
    "call.after_answer",
    "finish.before",
    "finish.after",
    "shutdown.before_release",
    "shutdown.after_release",
    "fallback.before_move",
    "fallback.after_move",
];

/// Refuses `SENDONCE_FAILPOINTS` where it would do nothing (a build
/// without the feature) or names a point or action that does not exist: a
/// test that means to crash the binary somewhere must not pass because the
/// binary never crashed.
pub fn check_configuration() -> Result<(), String> {
    let Ok(spec) = std::env::var("SENDONCE_FAILPOINTS") else {
        return Ok(());
    };
    if !cfg!(feature = "failpoints") {
        return Err(
            "SENDONCE_FAILPOINTS is set, but this build has no failpoints \
             (they are for tests: build with --features failpoints)"
                .into(),
        );
    }
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let known = entry.split_once('=').is_some_and(|(name, action)| {
            POINTS.contains(&name) && matches!(action, "kill" | "stop")
        });
        if !known {
            return Err(format!(
                "SENDONCE_FAILPOINTS: {entry:?} is not POINT=kill or POINT=stop with a point of {}",
                POINTS.join(", ")
            ));
        }
    }
    Ok(())
}

/// Reached point `name`: acts as configured (test builds only).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &'static str) {}

/// Reached point `name`: acts as configured (test builds only).
#[cfg(feature = "failpoints")]
pub fn hit(name: &'static str) {
    active::hit(name);
}

#[cfg(feature = "failpoints")]
mod active {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Action {
        Kill,
        Stop,
    }

    struct Point {
        action: Action,
        fired: AtomicBool,
    }

    fn configured() -> &'static HashMap<&'static str, Point> {
        static POINTS: OnceLock<HashMap<&'static str, Point>> = OnceLock::new();
        POINTS.get_or_init(|| {
            let spec = std::env::var("SENDONCE_FAILPOINTS").unwrap_or_default();
            spec.split(',')
                .filter(|s| !s.trim().is_empty())
                .filter_map(|entry| {
                    let (name, action) = entry.trim().split_once('=')?;
                    let name = *super::POINTS.iter().find(|p| **p == name)?;
                    let action = match action {
                        "kill" => Action::Kill,
                        "stop" => Action::Stop,
                        _ => return None,
                    };
                    Some((
                        name,
                        Point {
                            action,
                            fired: AtomicBool::new(false),
                        },
                    ))
                })
                .collect()
        })
    }

    pub(super) fn hit(name: &'static str) {
        let Some(point) = configured().get(name) else {
            return;
        };
        if point.fired.swap(true, Ordering::AcqRel) {
            return;
        }
        eprintln!("failpoint {name}: {:?}", point.action);
        let signal = match point.action {
            Action::Kill => libc::SIGKILL,
            Action::Stop => libc::SIGSTOP,
        };
        // SAFETY: `raise` only sends a signal to this very process.
        unsafe {
            libc::raise(signal);
        }
    }
}
