//! The GPU backend as a session sees it: `mgn_gpu`'s session with the `gpu` feature (the
//! default), else a type with no values, so that a CPU-only build (`default-features = false`)
//! links no Vulkan, naga or blade and every GPU branch of `Session` is statically dead.

#[cfg(feature = "gpu")]
pub use mgn_gpu::session::{family, GpuSession as Device, Profile, Timed};
#[cfg(feature = "gpu")]
pub use mgn_gpu::GpuError;

#[cfg(feature = "gpu")]
pub fn open(plan: mgn_ir::Plan, params: &[mgn_ir::Tensor]) -> Result<Device, GpuError> {
    Device::new(plan, params)
}

/// Where GPU sessions opened from now on keep and find the kernel choices they measured on
/// their device (`mgn_gpu::session::choices`): the folder `mgnc tune --cache DIR` filled, which
/// an app ships beside its plan, so that its first session on a tuned device measures nothing.
/// `None` goes back to the default (`MGN_CACHE`, else `~/.cache/mgn`). A folder that cannot be
/// written only costs each session its measuring again. Does nothing without the `gpu`
/// feature.
pub fn set_cache_dir(dir: Option<std::path::PathBuf>) {
    #[cfg(feature = "gpu")]
    mgn_gpu::session::set_cache_dir(dir);
    #[cfg(not(feature = "gpu"))]
    let _ = dir;
}

/// Where GPU sessions keep their measured kernel choices now (`set_cache_dir`); `None` without
/// a home folder or without the `gpu` feature.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    #[cfg(feature = "gpu")]
    return mgn_gpu::session::cache_dir();
    #[cfg(not(feature = "gpu"))]
    None
}

/// Whether the device `Session::use_gpu` would take is a hardware GPU (not a software one such
/// as lavapipe, which is slower than the CPU backend). False without the `gpu` feature.
pub fn hardware_gpu() -> bool {
    #[cfg(feature = "gpu")]
    {
        use mgn_gpu::probe::{choose, devices};
        devices().is_ok_and(|d| choose(&d).is_ok_and(|d| !d.software))
    }
    #[cfg(not(feature = "gpu"))]
    false
}

#[cfg(not(feature = "gpu"))]
pub use none::*;

#[cfg(not(feature = "gpu"))]
mod none {
    use mgn_ir::optim::OptimizerState;
    use mgn_ir::tensor::{RunOutput, Tensor};
    use mgn_ir::Plan;

    /// Why there is no GPU: this build left the backend out.
    #[derive(Debug)]
    pub enum GpuError {
        NoDevice(String),
    }

    impl std::fmt::Display for GpuError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let GpuError::NoDevice(why) = self;
            f.write_str(why)
        }
    }

    pub fn open(_: Plan, _: &[Tensor]) -> Result<Device, GpuError> {
        Err(GpuError::NoDevice(
            "this build of mgn-runtime has no GPU backend (its `gpu` feature is off)".into(),
        ))
    }

    /// No value of this type exists: without the feature a session never holds a device.
    pub enum Device {}

    type R<T> = Result<T, GpuError>;

    impl Device {
        pub fn device_name(&self) -> &str {
            match *self {}
        }
        pub fn setup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
            match *self {}
        }
        pub fn pipeline_times(&self) -> Vec<(String, std::time::Duration)> {
            match *self {}
        }
        pub fn setup_alongside(&self) -> std::time::Duration {
            match *self {}
        }
        pub fn choices(&self) -> (usize, usize) {
            match *self {}
        }
        pub fn set_params(&mut self, _: &[Tensor]) -> R<()> {
            match *self {}
        }
        pub fn params(&mut self) -> R<Vec<Option<Tensor>>> {
            match *self {}
        }
        pub fn read_params(&mut self, _: &[usize]) -> R<Vec<Option<Tensor>>> {
            match *self {}
        }
        pub fn write_params(&mut self, _: &[(usize, &Tensor)]) -> R<()> {
            match *self {}
        }
        pub fn set_optimizer_state(&mut self, _: &OptimizerState) -> R<()> {
            match *self {}
        }
        pub fn optimizer_state(&mut self, _: u64) -> R<OptimizerState> {
            match *self {}
        }
        pub fn run(&mut self, _: &[(&str, &Tensor)], _: u64) -> R<RunOutput> {
            match *self {}
        }
        pub fn run_resident(&mut self, _: &[(&str, &Tensor)], _: u64) -> R<()> {
            match *self {}
        }
        pub fn train_step(&mut self, _: &[(&str, &Tensor)], _: u64, _: u64) -> R<(f64, bool)> {
            match *self {}
        }
    }
}
