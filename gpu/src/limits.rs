//! Device limits, and the guaranteed floor every kernel must fit.
//!
//! Vulkan guarantees far less than development GPUs report, and each limit below has broken
//! real devices. Kernels are sized by these numbers (never by constants), and `MGN_MIN_SPEC=1`
//! makes any machine report only the guaranteed floor, so the floor is tested everywhere.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// maxComputeWorkGroupCount, per dimension.
    pub max_workgroups: [u32; 3],
    /// maxComputeWorkGroupInvocations.
    pub max_invocations: u32,
    /// maxComputeSharedMemorySize, in bytes.
    pub max_shared_memory: u32,
    /// maxStorageBufferRange, in bytes: the largest span one binding may cover.
    pub max_storage_buffer_range: u64,
    /// maxPerStageDescriptorStorageBuffers.
    pub max_storage_buffers: u32,
    /// Push constants / uniform parameter block, in bytes.
    pub max_parameter_block: u32,
    /// The square tile (8 or 16) of the device's cooperative-matrix products of f16 operands
    /// into f32 accumulators (`VK_KHR_cooperative_matrix`, subgroup scope), 0 when it has none.
    pub coop_f16_tile: u32,
    /// The invocations in each subgroup when the device fixes that number for every compute
    /// pipeline; 0 when it varies (AMD's and Intel's pipelines choose) or is not known.
    pub subgroup_size: u32,
}

impl DeviceLimits {
    /// What every conformant Vulkan device guarantees (and what `MGN_MIN_SPEC=1` reports).
    pub const MIN_SPEC: DeviceLimits = DeviceLimits {
        max_workgroups: [65535, 65535, 65535],
        max_invocations: 128,
        max_shared_memory: 16 * 1024,
        max_storage_buffer_range: 128 << 20,
        max_storage_buffers: 4,
        max_parameter_block: 128,
        coop_f16_tile: 0,
        subgroup_size: 0,
    };

    /// The reported limits, or the floor when `MGN_MIN_SPEC=1` is set.
    pub fn effective(reported: DeviceLimits) -> DeviceLimits {
        if min_spec_requested() {
            DeviceLimits::MIN_SPEC
        } else {
            reported
        }
    }

    /// The widest 1-D workgroup not above `preferred` that the device runs: a power of two.
    pub fn workgroup_width(&self, preferred: u32) -> u32 {
        let cap = preferred.min(self.max_invocations).max(1);
        1 << (31 - cap.leading_zeros())
    }

    /// The tile of cooperative-matrix kernels, when kernels may use them: the device has them
    /// and fixes its subgroups' size (a kernel assigns tiles to subgroups by number), and
    /// `MGN_COOP=0` does not turn them off. Which steps take them is `coop_use`'s.
    pub fn coop_tile(&self) -> Option<u32> {
        let usable = self.coop_f16_tile > 0 && self.subgroup_size > 0;
        (usable && coop_use() != CoopUse::Off).then_some(self.coop_f16_tile)
    }

    /// Whether a tensor of `bytes` fits in one binding.
    pub fn fits_binding(&self, bytes: u64) -> bool {
        bytes <= self.max_storage_buffer_range
    }
}

/// Which f16 products and convolutions run on cooperative matrices where the device has them.
/// Measured (`Measured`) unless `MGN_COOP` forces one side of that measurement: a debugging
/// override (which kernel a wrong result comes from, an A/B on one binary), not a setting a
/// deployment needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopUse {
    /// `MGN_COOP=products`: every f16 product (`kernels::matmul::coop::grid_for`);
    /// convolutions keep the tiled kernels (the default before measuring was).
    ByShape,
    /// `MGN_COOP=1`: every product and convolution they fit (an experiment's switch).
    Everywhere,
    /// Unset (or `MGN_COOP=measure`): each f16 product's and convolution's kernel measured on
    /// the device when a static plan's session opens — the tiled one against the tiles — and
    /// the faster kept, remembered per device on disk (`session::choices`); a dynamic plan's
    /// as `ByShape`. Timed on an H100 against `ByShape`: ResNet-50's mixed forward in 0.75 of
    /// its time, its training cells in 0.94, the U-Net's cells 0.98–1.0, ResNet-50's batch of
    /// one 1.02 (docs/benchmarks/).
    Measured,
    /// `MGN_COOP=0`: none; the tiled kernels multiply halves at the f32 rate.
    Off,
}

/// `MGN_COOP`'s choice (`CoopUse`). Any other value than `0`, `1`, `products` or `measure` is
/// the default.
pub fn coop_use() -> CoopUse {
    #[cfg(test)]
    if let Some(forced) = FORCED_COOP_USE.with(|f| f.get()) {
        return forced;
    }
    match std::env::var("MGN_COOP").as_deref() {
        Ok("1") => CoopUse::Everywhere,
        Ok("0") => CoopUse::Off,
        Ok("products") => CoopUse::ByShape,
        _ => CoopUse::Measured,
    }
}

#[cfg(test)]
thread_local! {
    /// A test's `MGN_COOP`, for its own thread: the process's environment is shared by tests
    /// running at once.
    pub(crate) static FORCED_COOP_USE: std::cell::Cell<Option<CoopUse>> =
        const { std::cell::Cell::new(None) };
}

/// How long one submission may take before the device is reported as hung (`GPU_TIMEOUT`, or
/// `MGN_GPU_TIMEOUT` seconds): a hung device then takes no more work and frees nothing.
pub fn gpu_timeout() -> Result<std::time::Duration, String> {
    std::env::var("MGN_GPU_TIMEOUT").map_or(Ok(GPU_TIMEOUT), |v| seconds(&v))
}

/// `MGN_GPU_TIMEOUT`'s value: seconds, more than none and within what a wait can take (u32 ms).
fn seconds(v: &str) -> Result<std::time::Duration, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= u32::MAX as f64 / 1000.0 => {
            Ok(std::time::Duration::from_secs_f64(s))
        }
        _ => Err(format!(
            "MGN_GPU_TIMEOUT={v} is not a number of seconds (more than 0, at most 4294967)"
        )),
    }
}

/// The default of `gpu_timeout`: far past any one submission of a real GPU (the H200's
/// longest, a training step, takes tens of ms) and of a software device's tests, short enough
/// that a hung GPU is reported. Lavapipe from Mesa 26.1 compiles cooperative-matrix kernels
/// when they are first dispatched, 4-6 s each, so a whole-model test's first submission there
/// can take minutes (`scripts/coop_tests.sh` waits longer).
pub const GPU_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// True when `MGN_MIN_SPEC` is set to `1` (or `true`).
pub fn min_spec_requested() -> bool {
    std::env::var("MGN_MIN_SPEC").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridTooLarge {
    pub workgroups: u64,
    pub capacity: u64,
}

impl fmt::Display for GridTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} workgroups exceed what one dispatch can address ({})",
            self.workgroups, self.capacity
        )
    }
}

impl std::error::Error for GridTooLarge {}

/// Folds a 1-D count of workgroups into a 3-D grid within the per-dimension limits.
///
/// The grid may hold a few more workgroups than asked for (`x * y * z >= n`); kernels compute
/// their linear index as `x + y * X + z * X * Y` and return when it is `>= n`. `x` is kept as
/// large as possible so that consecutive workgroups stay adjacent in memory.
pub fn fold_grid(n: u64, limits: &DeviceLimits) -> Result<[u32; 3], GridTooLarge> {
    let [mx, my, mz] = limits.max_workgroups.map(|m| m.max(1) as u64);
    let capacity = mx.saturating_mul(my).saturating_mul(mz);
    if n > capacity {
        return Err(GridTooLarge { workgroups: n, capacity });
    }
    if n == 0 {
        return Ok([0, 1, 1]);
    }
    let x = n.min(mx);
    let rows = n.div_ceil(x);
    let y = rows.min(my);
    let z = rows.div_ceil(y);
    debug_assert!(z <= mz && x * y * z >= n);
    Ok([x as u32, y as u32, z as u32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_grids_stay_one_dimensional() {
        assert_eq!(fold_grid(1, &DeviceLimits::MIN_SPEC), Ok([1, 1, 1]));
        assert_eq!(fold_grid(65535, &DeviceLimits::MIN_SPEC), Ok([65535, 1, 1]));
    }

    #[test]
    fn oversized_grids_fold_into_y_and_z() {
        let l = DeviceLimits::MIN_SPEC;
        for n in [65536u64, 1 << 20, 65535 * 65535, 65535 * 65535 + 1, 123_456_789_012] {
            let [x, y, z] = fold_grid(n, &l).expect("fits");
            assert!(x <= 65535 && y <= 65535 && z <= 65535, "{n}: {x} {y} {z}");
            let total = x as u64 * y as u64 * z as u64;
            assert!(total >= n, "{n}: covers only {total}");
            // No more than one partial row or plane of waste.
            assert!(total - n < x as u64 * y as u64, "{n}: wastes {}", total - n);
        }
    }

    #[test]
    fn grids_beyond_every_dimension_are_refused() {
        let l = DeviceLimits { max_workgroups: [4, 4, 4], ..DeviceLimits::MIN_SPEC };
        assert_eq!(fold_grid(64, &l), Ok([4, 4, 4]));
        assert_eq!(fold_grid(65, &l), Err(GridTooLarge { workgroups: 65, capacity: 64 }));
    }

    #[test]
    fn workgroup_width_respects_the_floor() {
        assert_eq!(DeviceLimits::MIN_SPEC.workgroup_width(256), 128);
        assert_eq!(DeviceLimits::MIN_SPEC.workgroup_width(100), 64);
        let big = DeviceLimits { max_invocations: 1024, ..DeviceLimits::MIN_SPEC };
        assert_eq!(big.workgroup_width(256), 256);
    }

    /// Cooperative matrices need the device's tiles and a fixed subgroup size, and
    /// `MGN_COOP=0` turns them off.
    #[test]
    fn cooperative_matrices_need_a_fixed_subgroup_size() {
        let h200 = DeviceLimits { coop_f16_tile: 16, subgroup_size: 32, ..DeviceLimits::MIN_SPEC };
        let varying = DeviceLimits { subgroup_size: 0, ..h200 };
        assert_eq!(varying.coop_tile(), None);
        assert_eq!(DeviceLimits::MIN_SPEC.coop_tile(), None);
        assert_eq!(h200.coop_tile(), (coop_use() != CoopUse::Off).then_some(16));
        if std::env::var_os("MGN_COOP").is_none() {
            assert_eq!(coop_use(), CoopUse::Measured);
            assert_eq!(h200.coop_tile(), Some(16), "on by default, as measured");
        }
    }

    #[test]
    fn gpu_timeouts_are_positive_seconds() {
        assert_eq!(seconds("600"), Ok(std::time::Duration::from_secs(600)));
        assert_eq!(seconds(" 0.5 "), Ok(std::time::Duration::from_millis(500)));
        for bad in ["0", "-3", "ten", "", "inf", "NaN", "1e10"] {
            let err = seconds(bad).expect_err(bad);
            assert!(err.starts_with(&format!("MGN_GPU_TIMEOUT={bad} ")), "{err}");
        }
    }

    #[test]
    fn bindings_are_bounded_by_the_storage_range() {
        assert!(DeviceLimits::MIN_SPEC.fits_binding(128 << 20));
        assert!(!DeviceLimits::MIN_SPEC.fits_binding((128 << 20) + 4));
    }
}
