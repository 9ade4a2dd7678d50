//! A GPU device opened through blade, and the one binding layout every generated kernel uses.
//!
//! Every kernel sees the same two bindings: `arena`, one storage buffer holding every tensor at
//! an element offset, and `params`, a 128-byte parameter block (offsets, sizes, strides). One
//! storage binding per kernel keeps far inside Vulkan's floor of 4 storage buffers per stage,
//! whatever the number of a kernel's inputs; 128 bytes is the guaranteed parameter-block size.
//! Tensors are stored as 32-bit words (`f32` and `i32` alike, reinterpreted with `bitcast`).
//!
//! Here: opening the device (`Connection`, `GpuDevice`), its arena and the submission type;
//! `compile.rs` makes pipelines on every core, `queue.rs` records and submits (staging,
//! streamed uploads, runs of levels in chunks, timestamps).

mod compile;
mod queue;
pub mod rounding;

use super::probe::{choose, devices, Device};
use crate::halves::F16Rounding;
use crate::limits::DeviceLimits;
use crate::GpuError;
use blade_graphics as gpu;
use compile::{compile, compile_all_while};
pub use compile::{source, PRELUDE};
use queue::Queue;

/// The parameter block: 32 words, seen in WGSL as `array<vec4<u32>, 8>` (uniform arrays need
/// 16-byte elements).
pub type Params = [u32; 32];

/// What every dispatch binds: the arena twice — as 32-bit words (`arena`, every kernel) and as
/// f16 halves (`arena_h`, only the cooperative-matrix kernels, which stage f16 operands with no
/// conversion: `kernels::Operand::f16_view`) — and the parameter block. A kernel that declares
/// no `arena_h` leaves that binding unused.
#[derive(Clone, Copy)]
struct Bindings {
    arena: gpu::BufferPiece,
    params: Params,
}

impl gpu::ShaderData for Bindings {
    fn layout() -> gpu::ShaderDataLayout {
        gpu::ShaderDataLayout {
            bindings: vec![
                ("arena", gpu::ShaderBinding::Buffer),
                ("params", gpu::ShaderBinding::Plain { size: 128 }),
                ("arena_h", gpu::ShaderBinding::Buffer),
            ],
        }
    }

    fn fill(&self, mut ctx: gpu::PipelineContext) {
        use gpu::ShaderBindable;
        self.arena.bind_to(&mut ctx, 0);
        self.params.bind_to(&mut ctx, 1);
        self.arena.bind_to(&mut ctx, 2);
    }
}

pub struct GpuDevice {
    /// Dropped by hand in `Drop`, under `LIFECYCLE` (see there).
    ctx: std::mem::ManuallyDrop<gpu::Context>,
    queue: Queue,
    pub info: Device,
    /// The limits kernels are sized by (the floor under `MGN_MIN_SPEC=1`).
    pub limits: DeviceLimits,
    /// How kernels compiled for it round f32s to f16 (`rounding`): probed when the first
    /// kernel that rounds is compiled, so a device that compiles none never runs the probe.
    f16_rounding: Option<F16Rounding>,
}

pub struct Kernel {
    pipeline: gpu::ComputePipeline,
    pub name: String,
    /// How long naga and the driver took to make its pipeline (on one thread).
    pub compile_time: std::time::Duration,
}

pub struct Arena {
    buffer: gpu::Buffer,
    /// Size in 32-bit words.
    pub words: usize,
}

/// One dispatch: a kernel, its parameter block and its (folded) grid.
pub type Dispatch<'a> = (&'a Kernel, Params, [u32; 3]);

/// Everything one submission does, in order: zero the `zeros` (arena word offset, length) and
/// copy `uploads` (offset, words) in, run the dispatch `levels` — dispatches within a level are
/// independent, and a memory barrier separates consecutive levels — then copy `downloads`
/// (offset, length) out, and last make the arena-to-arena `copies` (from, to, length), one
/// pass per group with a barrier between groups: how state written by a run replaces its
/// parameters once every dispatch and download has read the old words.
#[derive(Default)]
pub struct Submission<'a> {
    pub zeros: Vec<(usize, usize)>,
    pub uploads: Vec<(usize, &'a [u32])>,
    pub levels: Vec<Vec<Dispatch<'a>>>,
    pub downloads: Vec<(usize, usize)>,
    pub copies: Vec<Vec<(usize, usize, usize)>>,
}

impl Submission<'_> {
    /// Every zeroed, uploaded and downloaded range inside an arena of `words` words.
    fn check(&self, words: usize) -> Result<(), String> {
        let ranges = self.zeros.iter().map(|&(o, n)| ("zeroing", o, n));
        let ranges = ranges.chain(self.uploads.iter().map(|&(o, d)| ("upload", o, d.len())));
        let ranges = ranges.chain(self.downloads.iter().map(|&(o, n)| ("download", o, n)));
        let copies = self.copies.iter().flatten();
        let ranges = ranges.chain(copies.flat_map(|&(f, t, n)| [("copy", f, n), ("copy", t, n)]));
        for (what, offset, len) in ranges {
            if offset + len > words {
                return Err(format!(
                    "{what} of {len} words at {offset} runs past the arena ({words} words)"
                ));
            }
        }
        Ok(())
    }
}

/// The driver's context of an opened device, before its command encoders exist: what may be
/// made on another thread (the encoders may not move between threads) while this one works.
pub struct Connection(std::mem::ManuallyDrop<gpu::Context>);

impl Connection {
    /// Opens `info`'s device (one thread of the process at a time: `lifecycle`).
    pub fn open(info: &Device) -> Result<Connection, GpuError> {
        // MGN_PROFILE=1 turns on GPU timestamps (see `profile`); they cost a little per pass.
        let timing = std::env::var("MGN_PROFILE").is_ok_and(|v| v == "1");
        // MGN_PIPELINE_STATS=1 asks the driver for each pipeline's statistics (registers,
        // spills, where it reports them: `compile::report_statistics`), which blade collects
        // only in its capture mode; that mode also writes every kernel's WGSL into the temp
        // folder's `blade/` and adds debug information to the SPIR-V.
        let capture = compile::statistics_wanted();
        let desc =
            gpu::ContextDesc { device_id: Some(info.id), timing, capture, ..Default::default() };
        let _one_at_a_time = lifecycle();
        let ctx = std::panic::catch_unwind(|| unsafe { gpu::Context::init(desc) })
            .map_err(|_| {
                GpuError::NoDevice(format!("the driver crashed while opening {}", info.name))
            })?
            .map_err(|e| GpuError::NoDevice(format!("cannot open {}: {e:?}", info.name)))?;
        Ok(Connection(std::mem::ManuallyDrop::new(ctx)))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Only a connection that never became a device gets here (`GpuDevice::on` takes its
        // context): destroyed under the same lock as a device's.
        let _one_at_a_time = lifecycle();
        // SAFETY: `self.0` is not used again; this is the only place it is dropped.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) };
    }
}

impl GpuDevice {
    /// Opens the device `probe::choose` picks (hardware first, `MGN_DEVICE` to override).
    pub fn open() -> Result<GpuDevice, GpuError> {
        let (info, limits) = GpuDevice::chosen()?;
        GpuDevice::open_on(info, limits)
    }

    /// The device `open` opens and the limits its kernels are sized by (the floor under
    /// `MGN_MIN_SPEC=1`), from the driver's list alone: kernels can be made before (or while)
    /// the device opens.
    pub fn chosen() -> Result<(Device, DeviceLimits), GpuError> {
        crate::limits::gpu_timeout().map_err(GpuError::Failed)?;
        let all = devices().map_err(GpuError::NoDevice)?;
        let info = choose(&all).map_err(GpuError::NoDevice)?.clone();
        let limits = DeviceLimits::effective(info.limits.unwrap_or(DeviceLimits::MIN_SPEC));
        Ok((info, limits))
    }

    /// Opens the device `info` (from `chosen`) with `limits`.
    pub fn open_on(info: Device, limits: DeviceLimits) -> Result<GpuDevice, GpuError> {
        Ok(GpuDevice::on(Connection::open(&info)?, info, limits))
    }

    /// The device over an open connection (its command encoders stay on this thread).
    pub fn on(connection: Connection, info: Device, limits: DeviceLimits) -> GpuDevice {
        let mut connection = std::mem::ManuallyDrop::new(connection);
        // SAFETY: the connection is forgotten, so its context is taken exactly once and its own
        // `Drop` never runs; the device drops the context instead.
        let ctx =
            std::mem::ManuallyDrop::new(unsafe { std::mem::ManuallyDrop::take(&mut connection.0) });
        // Checked by `chosen`, which every device's opening goes through.
        let patience = crate::limits::gpu_timeout().unwrap_or(crate::limits::GPU_TIMEOUT);
        let queue = Queue::new(&ctx, patience);
        GpuDevice { ctx, queue, info, limits, f16_rounding: None }
    }

    /// How kernels compiled for this device round f32s to f16 (`rounding`: probed on the first
    /// call, once per device and process).
    pub fn f16_rounding(&mut self) -> F16Rounding {
        match self.f16_rounding {
            Some(r) => r,
            None => {
                let r = rounding::of(self);
                self.f16_rounding = Some(r);
                r
            }
        }
    }

    /// The rounding to compile `bodies` with: the device's, where one of them rounds to f16.
    fn rounding_for<'a>(&mut self, mut bodies: impl Iterator<Item = &'a str>) -> F16Rounding {
        if bodies.any(crate::halves::rounds_to_f16) {
            self.f16_rounding()
        } else {
            F16Rounding::SOFTWARE
        }
    }

    /// Compiles a kernel (`PRELUDE` + body). WGSL that naga rejects is an error with its message.
    pub fn kernel(&mut self, name: &str, body: &str) -> Result<Kernel, String> {
        let rounding = self.rounding_for(std::iter::once(body));
        let _no_device_opens_or_closes = compiling();
        compile(&self.ctx, name, body, rounding)
    }

    /// Compiles `(name, body)` kernels spread over the machine's cores — pipeline creation (naga,
    /// then the driver's compiler) is most of opening a session, and the kernels are independent.
    /// Results in the given order.
    pub fn kernels(&mut self, sources: &[(String, String)]) -> Vec<Result<Kernel, String>> {
        let rounding = self.rounding_for(sources.iter().map(|(_, b)| b.as_str()));
        compile_all_while(&self.ctx, sources, rounding, || ()).0
    }

    /// `kernels`, while this thread allocates an arena of `words` words and makes the `fill`
    /// submission into it (a session's parameters): the upload crosses the bus while the
    /// driver compiles. Also returns how long the arena and the fill took.
    pub fn kernels_and_arena(
        &mut self,
        sources: &[(String, String)],
        words: usize,
        fill: &Submission,
    ) -> (Vec<Result<Kernel, String>>, Result<Arena, String>, std::time::Duration) {
        if let Err(e) = self.check_arena(words) {
            return (self.kernels(sources), Err(e), std::time::Duration::ZERO);
        }
        let rounding = self.rounding_for(sources.iter().map(|(_, b)| b.as_str()));
        let (ctx, queue) = (&*self.ctx, &mut self.queue);
        let (kernels, (arena, took)) = compile_all_while(ctx, sources, rounding, || {
            let start = std::time::Instant::now();
            let arena =
                queue.arena(ctx, words).and_then(|arena| match queue.submit(ctx, &arena, fill) {
                    Ok(_) => Ok(arena),
                    Err(e) => {
                        queue.release(ctx, arena.buffer);
                        Err(e)
                    }
                });
            (arena, start.elapsed())
        });
        (kernels, arena, took)
    }

    /// Whether one binding holds an arena of `words` words on this device.
    fn check_arena(&self, words: usize) -> Result<(), String> {
        let bytes = (words.max(1) * 4) as u64;
        if self.limits.fits_binding(bytes) {
            Ok(())
        } else {
            Err(format!(
                "{bytes} bytes exceed one binding on this device ({} bytes)",
                self.limits.max_storage_buffer_range
            ))
        }
    }

    /// A device-local arena of `words` 32-bit words, zeroed.
    pub fn arena(&mut self, words: usize) -> Result<Arena, String> {
        self.check_arena(words)?;
        self.queue.arena(&self.ctx, words)
    }

    /// Frees the arena's device memory — unless a submission did not finish (`hung`): a
    /// kernel may still be using it, and it is left to the driver.
    pub fn free(&mut self, arena: Arena) {
        self.queue.release(&self.ctx, arena.buffer);
    }

    /// Whether a submission did not finish in time (or the driver failed while waiting): the
    /// device then takes no more work, and frees nothing the GPU may still use.
    pub fn hung(&self) -> bool {
        self.queue.hung()
    }

    /// Copies `data` into the arena at word `offset` (one submission of its own).
    pub fn write(&mut self, arena: &Arena, offset: usize, data: &[u32]) -> Result<(), String> {
        self.submit(arena, &Submission { uploads: vec![(offset, data)], ..Default::default() })
            .map(drop)
    }

    /// Reads `len` words at `offset` back from the arena (one submission of its own).
    pub fn read(&mut self, arena: &Arena, offset: usize, len: usize) -> Result<Vec<u32>, String> {
        Ok(self
            .submit(arena, &Submission { downloads: vec![(offset, len)], ..Default::default() })?
            .remove(0))
    }

    /// Records the dispatches in order, each after the previous one, and waits.
    pub fn run(&mut self, arena: &Arena, dispatches: &[Dispatch]) -> Result<(), String> {
        let levels = dispatches.iter().map(|d| vec![*d]).collect();
        self.submit(arena, &Submission { levels, ..Default::default() }).map(drop)
    }

    /// Records a `Submission` (its levels in chunks, each submitted once recorded) and waits
    /// for it; returns the downloads.
    pub fn submit(&mut self, arena: &Arena, job: &Submission) -> Result<Vec<Vec<u32>>, String> {
        self.queue.submit(&self.ctx, arena, job)
    }

    /// GPU time of each dispatch of `levels` (in order), measured with timestamps between passes:
    /// one pass per dispatch. Needs `MGN_PROFILE=1` when the device was opened. The extra
    /// barriers make the total slower than a real run; the split across dispatches is what it
    /// is for.
    pub fn profile(
        &mut self,
        arena: &Arena,
        levels: &[Vec<Dispatch>],
    ) -> Result<Vec<std::time::Duration>, String> {
        self.queue.profile(&self.ctx, arena, levels)
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        if self.queue.hung() {
            // Destroying the device under a running submission is undefined; a hung GPU's
            // context is leaked with everything in it.
            return;
        }
        self.queue.destroy(&self.ctx);
        let _one_at_a_time = lifecycle();
        // SAFETY: `ctx` is not used again; this is the only place it is dropped.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.ctx) };
    }
}

/// Held while a device is created or destroyed, so that one thread of the process does either
/// at a time, and never while another thread compiles kernels (`compiling`). On the H200
/// (NVIDIA 580.159), the runtime's tests under `MGN_MIN_SPEC=1` — four threads, each opening
/// and closing its own devices — hung inside the driver: no call returned and no wait timed
/// out. On lavapipe (Mesa 22.3, LLVM 15), two tests' sessions — one compiling its kernels on
/// several threads while the other's device closed — crashed the compiling threads at one
/// address inside the driver (a segfault seen twice in one suite run, under load). Serialising
/// the calls that touch the driver's process-wide state is the cheap cure (they run once per
/// session); apps that open sessions on several threads get the same protection.
fn lifecycle() -> std::sync::RwLockWriteGuard<'static, ()> {
    // A panic while held (a driver crash caught above) leaves nothing half-done to protect.
    LIFECYCLE.write().unwrap_or_else(|e| e.into_inner())
}

/// Held while kernels compile: sessions compile at the same time as each other, but not while
/// a device opens or closes (`lifecycle`).
pub(super) fn compiling() -> std::sync::RwLockReadGuard<'static, ()> {
    LIFECYCLE.read().unwrap_or_else(|e| e.into_inner())
}

static LIFECYCLE: std::sync::RwLock<()> = std::sync::RwLock::new(());

#[cfg(test)]
mod tests;
