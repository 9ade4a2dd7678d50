//! What tests that need a GPU share: they skip when there is no device, and only then.
//!
//! A skip is said on stderr and, when `MGN_SKIP_LOG` names a file, recorded there as one line
//! (`test<TAB>reason`; `scripts/test.sh` counts them). `MGN_REQUIRE_GPU=1` (CI, where lavapipe
//! is installed) turns a missing device into a failure too. Any other error fails the test.

use crate::GpuError;
use std::io::Write;

/// Whether this run must have a device (`MGN_REQUIRE_GPU=1`).
pub fn device_required() -> bool {
    std::env::var("MGN_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The running test's name (libtest names each test's thread after it).
fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_string()
}

/// Records that the running test skipped for want of a device.
pub fn record_skip(why: &str) {
    let test = current_test();
    eprintln!("skipped (no device): {test}: {why}");
    if let Some(path) = std::env::var_os("MGN_SKIP_LOG") {
        let line = format!("{test}\t{}\n", why.replace('\n', " "));
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The value, or `None` after recording a skip when the error is [`GpuError::NoDevice`] and a
/// device is not required. Every other error panics with its message.
pub fn or_skip<T>(r: Result<T, GpuError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(GpuError::NoDevice(why)) if !device_required() => {
            record_skip(&why);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Whether a device `GpuDevice::open` would take is listed: true, or false after recording a
/// skip (a failure under `MGN_REQUIRE_GPU=1`). For tests that run `mgnc` on the GPU as a
/// separate process, which must then succeed.
pub fn device_listed() -> bool {
    let found = crate::probe::devices()
        .and_then(|d| crate::probe::choose(&d).map(drop))
        .map_err(GpuError::NoDevice);
    or_skip(found).is_some()
}
