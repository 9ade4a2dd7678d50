//! A GPU device opened through blade, and the one binding layout every generated kernel uses.
//!
//! Every kernel sees the same two bindings: `arena`, one storage buffer holding every tensor at
//! an element offset, and `params`, a 128-byte parameter block (offsets, sizes, strides). One
//! storage binding per kernel keeps far inside Vulkan's floor of 4 storage buffers per stage,
//! whatever the number of a kernel's inputs; 128 bytes is the guaranteed parameter-block size.
//! Tensors are stored as 32-bit words (`f32` and `i32` alike, reinterpreted with `bitcast`).

use super::probe::{choose, devices, Device};
use crate::limits::DeviceLimits;
use crate::GpuError;
use blade_graphics as gpu;

/// The parameter block: 32 words, seen in WGSL as `array<vec4<u32>, 8>` (uniform arrays need
/// 16-byte elements).
pub type Params = [u32; 32];

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
            ],
        }
    }

    fn fill(&self, mut ctx: gpu::PipelineContext) {
        use gpu::ShaderBindable;
        self.arena.bind_to(&mut ctx, 0);
        self.params.bind_to(&mut ctx, 1);
    }
}

fn compile(ctx: &gpu::Context, name: &str, body: &str) -> Result<Kernel, String> {
    let source = format!("{PRELUDE}{body}");
    let module = naga::front::wgsl::parse_str(&source)
        .map_err(|e| format!("kernel `{name}`: {}", e.emit_to_string(&source)))?;
    let shader = ctx
        .try_create_shader(gpu::ShaderDesc { source: &source, naga_module: Some(module) })
        .map_err(|e| format!("kernel `{name}`: {e}"))?;
    let layout = <Bindings as gpu::ShaderData>::layout();
    let pipeline = ctx.create_compute_pipeline(gpu::ComputePipelineDesc {
        name,
        data_layouts: &[&layout],
        compute: shader.at("main"),
    });
    Ok(Kernel { pipeline, name: name.to_string() })
}

/// The WGSL declarations every kernel starts with.
pub const PRELUDE: &str = "struct Params { p: array<vec4<u32>, 8> }
var<storage, read_write> arena: array<u32>;
var<uniform> params: Params;
";

/// A run's levels go in up to `CHUNKS` command buffers, the first of `FIRST_CHUNK` dispatches
/// and each next of twice as many (the last takes the rest), each submitted once recorded; a
/// run of fewer than `CHUNKED` dispatches goes in one. On the H200 recording takes 1-2 µs a
/// dispatch and running one about 4, so the GPU stays ahead of the CPU; each command buffer
/// more costs a few µs, which a short run (MiniLM at one token, 0.39 → 0.43 ms with chunks of
/// 32) does not win back.
const CHUNKS: usize = 8;
const FIRST_CHUNK: usize = 32;
const CHUNKED: usize = 128;

pub struct GpuDevice {
    /// Dropped by hand in `Drop`, under `LIFECYCLE` (see there).
    ctx: std::mem::ManuallyDrop<gpu::Context>,
    encoder: gpu::CommandEncoder,
    /// A run's command buffers (`submit`), one per chunk of its levels, `CHUNKS` in rotation.
    runs: gpu::CommandEncoder,
    pub info: Device,
    /// The limits kernels are sized by (the floor under `MGN_MIN_SPEC=1`).
    pub limits: DeviceLimits,
    /// Host-visible staging for uploads and for readback, grown on demand and kept: the arena
    /// itself is device-local, which on a discrete GPU the host cannot map (or only slowly).
    upload: Option<Staging>,
    download: Option<Staging>,
}

struct Staging {
    buffer: gpu::Buffer,
    words: usize,
}

pub struct Kernel {
    pipeline: gpu::ComputePipeline,
    pub name: String,
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

impl GpuDevice {
    /// Opens the device `probe::choose` picks (hardware first, `MGN_DEVICE` to override).
    pub fn open() -> Result<GpuDevice, GpuError> {
        let all = devices().map_err(GpuError::NoDevice)?;
        let info = choose(&all).map_err(GpuError::NoDevice)?.clone();
        // MGN_PROFILE=1 turns on GPU timestamps (see `profile`); they cost a little per pass.
        let timing = std::env::var("MGN_PROFILE").is_ok_and(|v| v == "1");
        let desc = gpu::ContextDesc { device_id: Some(info.id), timing, ..Default::default() };
        let ctx = {
            let _one_at_a_time = lifecycle();
            std::panic::catch_unwind(|| unsafe { gpu::Context::init(desc) })
                .map_err(|_| {
                    GpuError::NoDevice(format!("the driver crashed while opening {}", info.name))
                })?
                .map_err(|e| GpuError::NoDevice(format!("cannot open {}: {e:?}", info.name)))?
        };
        let ctx = std::mem::ManuallyDrop::new(ctx);
        let encoder = ctx.create_command_encoder(gpu::CommandEncoderDesc {
            name: "mgn",
            buffer_count: 1,
            manual_barriers: false,
        });
        let runs = ctx.create_command_encoder(gpu::CommandEncoderDesc {
            name: "mgn run",
            buffer_count: CHUNKS as u32,
            manual_barriers: false,
        });
        let limits = DeviceLimits::effective(info.limits.unwrap_or(DeviceLimits::MIN_SPEC));
        Ok(GpuDevice { ctx, encoder, runs, info, limits, upload: None, download: None })
    }

    /// Compiles a kernel (`PRELUDE` + body). WGSL that naga rejects is an error with its message.
    pub fn kernel(&self, name: &str, body: &str) -> Result<Kernel, String> {
        compile(&self.ctx, name, body)
    }

    /// Compiles `(name, body)` kernels spread over the machine's cores — pipeline creation (naga,
    /// then the driver's compiler) is most of opening a session, and the kernels are independent.
    /// Results in the given order.
    pub fn kernels(&self, sources: &[(String, String)]) -> Vec<Result<Kernel, String>> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
        let chunk = sources.len().div_ceil(threads).max(1);
        let ctx = &self.ctx;
        std::thread::scope(|scope| {
            let jobs: Vec<_> = sources
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter().map(|(name, body)| compile(ctx, name, body)).collect::<Vec<_>>()
                    })
                })
                .collect();
            jobs.into_iter()
                .flat_map(|j| {
                    j.join().unwrap_or_else(|_| {
                        vec![Err("the driver crashed while compiling a kernel".to_string())]
                    })
                })
                .collect()
        })
    }

    /// A device-local arena of `words` 32-bit words, zeroed.
    pub fn arena(&mut self, words: usize) -> Result<Arena, String> {
        let bytes = (words.max(1) * 4) as u64;
        if !self.limits.fits_binding(bytes) {
            return Err(format!(
                "{bytes} bytes exceed one binding on this device ({} bytes)",
                self.limits.max_storage_buffer_range
            ));
        }
        let buffer = self.ctx.create_buffer(gpu::BufferDesc {
            name: "arena",
            size: bytes,
            memory: gpu::Memory::Device,
        });
        self.encoder.start();
        self.encoder.transfer("zero").fill_buffer(buffer.into(), bytes, 0);
        let sp = self.ctx.submit(&mut self.encoder);
        self.wait(&sp)?;
        Ok(Arena { buffer, words: words.max(1) })
    }

    /// Frees the arena's device memory.
    pub fn free(&mut self, arena: Arena) {
        self.ctx.destroy_buffer(arena.buffer);
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

    fn staging(&mut self, download: bool, words: usize) -> Option<gpu::Buffer> {
        if words == 0 {
            return None;
        }
        let slot = if download { &mut self.download } else { &mut self.upload };
        if slot.as_ref().is_some_and(|s| s.words < words) {
            self.ctx.destroy_buffer(slot.take().expect("checked").buffer);
        }
        let memory = if download { gpu::Memory::Download } else { gpu::Memory::Upload };
        let s = slot.get_or_insert_with(|| Staging {
            buffer: self.ctx.create_buffer(gpu::BufferDesc {
                name: "staging",
                size: words as u64 * 4,
                memory,
            }),
            words,
        });
        Some(s.buffer)
    }

    /// Records a `Submission` (its levels in chunks, each submitted once recorded) and waits
    /// for it; returns the downloads.
    pub fn submit(&mut self, arena: &Arena, job: &Submission) -> Result<Vec<Vec<u32>>, String> {
        job.check(arena.words)?;
        let up_words: usize = job.uploads.iter().map(|(_, d)| d.len()).sum();
        let down_words: usize = job.downloads.iter().map(|&(_, n)| n).sum();
        let up = self.staging(false, up_words);
        let down = self.staging(true, down_words);
        let enc = &mut self.runs;
        enc.start();
        if !job.zeros.is_empty() {
            // Filled on the device: nothing crosses the bus (an optimizer's fresh moments are
            // as large as the parameters, twice over).
            let mut pass = enc.transfer("zero");
            for &(offset, len) in &job.zeros {
                pass.fill_buffer(arena.buffer.at(offset as u64 * 4), len as u64 * 4, 0);
            }
        }
        if let Some(up) = up {
            let mut at = 0usize;
            let mut pass = enc.transfer("upload");
            for &(offset, data) in &job.uploads {
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        (up.data() as *mut u32).add(at),
                        data.len(),
                    )
                };
                pass.copy_buffer_to_buffer(
                    up.at(at as u64 * 4),
                    arena.buffer.at(offset as u64 * 4),
                    data.len() as u64 * 4,
                );
                at += data.len();
            }
        }
        record_levels(&self.ctx, enc, arena, &job.levels);
        if let Some(down) = down {
            let mut at = 0u64;
            let mut pass = enc.transfer("download");
            for &(offset, len) in &job.downloads {
                pass.copy_buffer_to_buffer(
                    arena.buffer.at(offset as u64 * 4),
                    down.at(at * 4),
                    len as u64 * 4,
                );
                at += len as u64;
            }
        }
        for group in job.copies.iter().filter(|g| g.iter().any(|&(_, _, n)| n > 0)) {
            // A pass of its own: blade's barrier before it orders the copies after the reads.
            let mut pass = enc.transfer("state");
            for &(from, to, len) in group.iter().filter(|&&(_, _, n)| n > 0) {
                pass.copy_buffer_to_buffer(
                    arena.buffer.at(from as u64 * 4),
                    arena.buffer.at(to as u64 * 4),
                    len as u64 * 4,
                );
            }
        }
        let sp = self.ctx.submit(enc);
        self.wait(&sp)?;
        let mut out = Vec::with_capacity(job.downloads.len());
        let mut at = 0usize;
        for &(_, len) in &job.downloads {
            let mut v = vec![0u32; len];
            // No staging when every download is empty (a tensor with a zero-sized axis).
            if let Some(down) = down.filter(|_| len > 0) {
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (down.data() as *const u32).add(at),
                        v.as_mut_ptr(),
                        len,
                    )
                };
            }
            at += len;
            out.push(v);
        }
        Ok(out)
    }

    /// GPU time of each dispatch of `levels` (in order), measured with timestamps between passes:
    /// one pass per dispatch, in submissions of at most `PASS_COUNT - 1` passes. Needs
    /// `MGN_PROFILE=1` when the device was opened. The extra barriers make the total slower
    /// than a real run; the split across dispatches is what it is for.
    pub fn profile(
        &mut self,
        arena: &Arena,
        levels: &[Vec<Dispatch>],
    ) -> Result<Vec<std::time::Duration>, String> {
        if std::env::var("MGN_PROFILE").map_or(true, |v| v != "1") {
            return Err("profiling needs MGN_PROFILE=1 when the session opens".into());
        }
        let all: Vec<&Dispatch> = levels.iter().flatten().collect();
        let mut out = Vec::with_capacity(all.len());
        let chunk = gpu::limits::PASS_COUNT - 1;
        for part in all.chunks(chunk) {
            self.encoder.start();
            for (k, params, groups) in part.iter().copied() {
                let mut pass = self.encoder.compute(&k.name);
                let mut pc = pass.with(&k.pipeline);
                pc.bind(0, &Bindings { arena: arena.buffer.into(), params: *params });
                pc.dispatch(*groups);
            }
            // A last, empty pass closes the previous one's interval.
            drop(self.encoder.compute("end"));
            let sp = self.ctx.submit(&mut self.encoder);
            self.wait(&sp)?;
            // Timestamps of a submission are collected when the encoder starts again.
            self.encoder.start();
            let t = self.encoder.timings();
            out.extend(t.iter().take(part.len()).map(|(_, d)| *d));
            let sp = self.ctx.submit(&mut self.encoder);
            self.wait(&sp)?;
        }
        Ok(out)
    }

    fn wait(&self, sp: &gpu::SyncPoint) -> Result<(), String> {
        match self.ctx.wait_for(sp, 120_000) {
            Ok(true) => Ok(()),
            Ok(false) => Err("the GPU did not finish within 120 s".into()),
            Err(e) => Err(format!("the GPU reported an error: {e:?}")),
        }
    }
}

/// Records a run's levels with a barrier between each two, in chunks of doubling size, each
/// submitted once recorded: the GPU runs the first while the CPU records the next (recording
/// costs about 1-2 µs a dispatch, a third of a one-token decoding step on the H200). A chunk
/// ends at a level's end; blade's barrier before each command buffer's first pass orders it
/// after the last. The last chunk is left in `enc`, for the caller to add to and submit.
fn record_levels(
    ctx: &gpu::Context,
    enc: &mut gpu::CommandEncoder,
    arena: &Arena,
    levels: &[Vec<Dispatch>],
) {
    let levels: Vec<&Vec<Dispatch>> = levels.iter().filter(|l| !l.is_empty()).collect();
    let sizes: Vec<usize> = levels.iter().map(|l| l.len()).collect();
    let mut next = 0;
    for end in chunk_ends(&sizes) {
        let mut pass = enc.compute("plan");
        for (k, level) in levels[next..end].iter().enumerate() {
            if k > 0 {
                pass.barrier();
            }
            for (kernel, params, groups) in level.iter() {
                let mut pc = pass.with(&kernel.pipeline);
                pc.bind(0, &Bindings { arena: arena.buffer.into(), params: *params });
                pc.dispatch(*groups);
            }
        }
        drop(pass);
        next = end;
        if next < levels.len() {
            // Waited for through the last submission (one queue, in order).
            ctx.submit(enc);
            enc.start();
        }
    }
}

/// Where a run's chunks end, as level indices past each chunk's last level, given each
/// level's dispatch count: `FIRST_CHUNK` dispatches, then twice as many each time (rounded up
/// to whole levels), at most `CHUNKS`; one chunk for fewer than `CHUNKED` dispatches.
fn chunk_ends(sizes: &[usize]) -> Vec<usize> {
    let total: usize = sizes.iter().sum();
    let (mut ends, mut end, mut recorded) = (Vec::new(), 0, 0);
    while end < sizes.len() {
        let chunk = ends.len();
        let last = chunk + 1 == CHUNKS || total < CHUNKED;
        let until = if last { total } else { recorded + (FIRST_CHUNK << chunk) };
        let start = end;
        while end < sizes.len() && (recorded < until || end == start) {
            recorded += sizes[end];
            end += 1;
        }
        ends.push(end);
    }
    ends
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[test]
    fn short_runs_are_one_chunk_and_long_ones_double_at_level_ends() {
        assert_eq!(chunk_ends(&[]), Vec::<usize>::new());
        assert_eq!(chunk_ends(&vec![1; CHUNKED - 1]), [CHUNKED - 1]);
        // 32, 64, 128 … dispatches of one each; the eighth chunk takes the rest.
        let ends = chunk_ends(&vec![1; 10_000]);
        assert_eq!(&ends[..3], &[32, 96, 224]);
        assert_eq!((ends.len(), ends.last()), (CHUNKS, Some(&10_000)));
        // A chunk ends only where a level does: levels of 3 cross 32 at 33.
        assert_eq!(chunk_ends(&vec![3; 100])[0], 11);
        // A level larger than a chunk is a chunk of its own.
        assert_eq!(chunk_ends(&[500, 1, 1]), [1, 3]);
    }
}

impl Drop for GpuDevice {
    fn drop(&mut self) {
        for s in [self.upload.take(), self.download.take()].into_iter().flatten() {
            self.ctx.destroy_buffer(s.buffer);
        }
        self.ctx.destroy_command_encoder(&mut self.encoder);
        self.ctx.destroy_command_encoder(&mut self.runs);
        let _one_at_a_time = lifecycle();
        // SAFETY: `ctx` is not used again; this is the only place it is dropped.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.ctx) };
    }
}

/// Held while a device is created or destroyed, so that one thread of the process does either
/// at a time. On the H200 (NVIDIA 580.159), the runtime's tests under `MGN_MIN_SPEC=1` — four
/// threads, each opening and closing its own devices — hung inside the driver: no call
/// returned and no wait timed out. Serialising the two calls that touch the driver's
/// process-wide state is the cheap cure (they run once per session); apps that open sessions on
/// several threads get the same protection.
fn lifecycle() -> std::sync::MutexGuard<'static, ()> {
    static LIFECYCLE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A panic while held (a driver crash caught above) leaves nothing half-done to protect.
    LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::fold_grid;

    /// Needs a Vulkan device (lavapipe in CI, where `MGN_REQUIRE_GPU=1` makes its absence a
    /// failure); elsewhere says so and passes.
    fn device() -> Option<GpuDevice> {
        crate::testing::or_skip(GpuDevice::open())
    }

    const ADD: &str = "@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * 64u;
    let n = params.p[0].x;
    if (i >= n) { return; }
    let a = bitcast<f32>(arena[params.p[0].y + i]);
    let b = bitcast<f32>(arena[params.p[0].z + i]);
    arena[params.p[0].w + i] = bitcast<u32>(a + b);
}
";

    #[test]
    fn a_kernel_runs_over_the_arena_and_matches_the_cpu() {
        let Some(mut dev) = device() else { return };
        let add = dev.kernel("add", ADD).expect("valid WGSL");
        let n = 1000usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
        let arena = dev.arena(3 * n).expect("fits");
        dev.write(&arena, 0, &a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).expect("uploads");
        dev.write(&arena, n, &b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).expect("uploads");
        let mut params = [0u32; 32];
        params[..4].copy_from_slice(&[n as u32, 0, n as u32, 2 * n as u32]);
        let groups = fold_grid(n.div_ceil(64) as u64, &dev.limits).expect("fits");
        dev.run(&arena, &[(&add, params, groups)]).expect("runs");
        let out: Vec<f32> =
            dev.read(&arena, 2 * n, n).expect("reads").into_iter().map(f32::from_bits).collect();
        for i in 0..n {
            assert_eq!(out[i], a[i] + b[i], "element {i}");
        }
        // A tensor with a zero-sized axis reads back as nothing (it has no staging).
        assert_eq!(dev.read(&arena, 0, 0).expect("reads nothing"), Vec::<u32>::new());
        // Zeroed on the device before the uploads of the same submission land.
        let job = Submission {
            zeros: vec![(1, n - 2)],
            uploads: vec![(3, &[7u32, 8][..])],
            ..Default::default()
        };
        dev.submit(&arena, &job).expect("zeroes and uploads");
        let got = dev.read(&arena, 0, n).expect("reads");
        assert_eq!(got[0], a[0].to_bits(), "before the zeros");
        assert_eq!(&got[1..6], &[0, 0, 7, 8, 0], "zeros, then the upload over them");
        assert!(got[6..n - 1].iter().all(|&w| w == 0));
        assert_eq!(got[n - 1], a[n - 1].to_bits(), "after the zeros");
        let past = Submission { zeros: vec![(3 * n - 1, 2)], ..Default::default() };
        let e = dev.submit(&arena, &past).unwrap_err();
        assert!(e.contains("runs past the arena"), "{e}");
    }

    #[test]
    fn grids_past_65535_workgroups_fold_and_cover_every_element() {
        let Some(mut dev) = device() else { return };
        // One invocation per workgroup, so 70,000 elements need 70,000 workgroups: more than
        // one dimension holds under the Vulkan floor.
        let body = "@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (i >= params.p[0].x) { return; }
    arena[i] = arena[i] + i + 1u;
}
";
        let k = dev.kernel("fill", body).expect("valid WGSL");
        let n = 70_000usize;
        let arena = dev.arena(n + 16).expect("fits");
        let mut params = [0u32; 32];
        params[0] = n as u32;
        let groups = fold_grid(n as u64, &dev.limits).expect("fits");
        assert!(groups[1] > 1 || dev.limits.max_workgroups[0] as usize >= n);
        dev.run(&arena, &[(&k, params, groups)]).expect("runs");
        let out = dev.read(&arena, 0, n + 16).expect("reads");
        for (i, v) in out.iter().enumerate() {
            assert_eq!(
                *v,
                if i < n { i as u32 + 1 } else { 0 },
                "element {i}: each written exactly once, nothing past the end"
            );
        }
    }

    #[test]
    fn invalid_wgsl_is_an_error_naming_the_kernel() {
        let Some(dev) = device() else { return };
        let Err(e) = dev
            .kernel("broken", "@compute @workgroup_size(1) fn main() { let x: f32 = arena[0]; }")
        else {
            panic!("must fail")
        };
        assert!(e.starts_with("kernel `broken`"), "{e}");
    }
}
