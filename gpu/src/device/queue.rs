//! The device's queue: command encoders, host-visible staging, and what goes through them —
//! arena allocation, uploads, runs of dispatch levels, downloads, profiles.

use super::{Arena, Bindings, Dispatch, Submission};
use blade_graphics as gpu;

/// A run's levels go in up to `CHUNKS` command buffers, the first of `FIRST_CHUNK` dispatches
/// and each next of twice as many (the last takes the rest), each submitted once recorded; a
/// run of fewer than `CHUNKED` dispatches goes in one. On the H200 recording takes 1-2 µs a
/// dispatch and running one about 4, so the GPU stays ahead of the CPU; each command buffer
/// more costs a few µs, which a short run (MiniLM at one token, 0.39 → 0.43 ms with chunks of
/// 32) does not win back.
const CHUNKS: usize = 8;
const FIRST_CHUNK: usize = 32;
const CHUNKED: usize = 128;

/// Words of each half of the upload staging buffer (16 MiB): an upload larger than both halves
/// streams through them (`Queue::stream`). On the H200 a fresh 513 MB staging buffer took
/// 400-470 ms to fill and copy, about 1.2 GB/s.
pub(super) const STAGE_WORDS: usize = 4 << 20;

/// The device's command encoders and staging buffers: everything a submission records into or
/// copies through. Apart from the context (`GpuDevice::ctx`), so that kernels compile on other
/// threads, borrowing the context alone, while this thread uploads (`kernels_and_arena`).
pub(super) struct Queue {
    encoder: gpu::CommandEncoder,
    /// A run's command buffers (`submit`), one per chunk of its levels, `CHUNKS` in rotation.
    runs: gpu::CommandEncoder,
    /// Host-visible staging for uploads and for readback, grown on demand and kept: the arena
    /// itself is device-local, which on a discrete GPU the host cannot map (or only slowly).
    upload: Option<Staging>,
    download: Option<Staging>,
    /// How long a submission may take before it is reported as hung (`limits::gpu_timeout`).
    patience: std::time::Duration,
    /// Set once a submission did not finish in time (or the driver reported an error while
    /// waiting): the GPU may still be reading and writing the arena, the staging buffers and
    /// the command buffers, so from then on none is destroyed or reused — they are leaked, and
    /// every later submission is an error. Freeing them under a running kernel is what crashed
    /// a slow software driver (lavapipe) inside its compiled shaders.
    hung: bool,
}

struct Staging {
    buffer: gpu::Buffer,
    words: usize,
}

impl Queue {
    pub(super) fn new(ctx: &gpu::Context, patience: std::time::Duration) -> Queue {
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
        Queue { encoder, runs, upload: None, download: None, patience, hung: false }
    }

    /// Whether a submission was left running (`hung`): nothing the GPU may use may be freed.
    pub(super) fn hung(&self) -> bool {
        self.hung
    }

    /// Waits at most `patience` for tests of what a hung submission leaves behind.
    #[cfg(test)]
    pub(super) fn set_patience(&mut self, patience: std::time::Duration) {
        self.patience = patience;
    }

    /// Destroys `buffer`, unless a submission may still be using it (then it is leaked).
    pub(super) fn release(&self, ctx: &gpu::Context, buffer: gpu::Buffer) {
        if !self.hung {
            ctx.destroy_buffer(buffer);
        }
    }

    /// An error once a submission was left running: nothing may be recorded after it.
    fn usable(&self) -> Result<(), String> {
        if self.hung {
            return Err("an earlier submission did not finish; this device takes no more work \
                 (its memory is left to the driver)"
                .into());
        }
        Ok(())
    }

    /// Waits for `sp`, at most `patience`; on a timeout or an error, marks the queue `hung`.
    fn wait(&mut self, ctx: &gpu::Context, sp: &gpu::SyncPoint) -> Result<(), String> {
        wait(ctx, sp, self.patience, &mut self.hung)
    }

    /// Destroys the staging buffers and encoders (only when not `hung`: see `GpuDevice`'s drop).
    pub(super) fn destroy(&mut self, ctx: &gpu::Context) {
        for s in [self.upload.take(), self.download.take()].into_iter().flatten() {
            ctx.destroy_buffer(s.buffer);
        }
        ctx.destroy_command_encoder(&mut self.encoder);
        ctx.destroy_command_encoder(&mut self.runs);
    }

    /// A device-local arena of `words` 32-bit words (at least one), zeroed.
    pub(super) fn arena(&mut self, ctx: &gpu::Context, words: usize) -> Result<Arena, String> {
        self.usable()?;
        let bytes = (words.max(1) * 4) as u64;
        let buffer = ctx.create_buffer(gpu::BufferDesc {
            name: "arena",
            size: bytes,
            memory: gpu::Memory::Device,
        });
        self.encoder.start();
        self.encoder.transfer("zero").fill_buffer(buffer.into(), bytes, 0);
        let sp = ctx.submit(&mut self.encoder);
        if let Err(e) = self.wait(ctx, &sp) {
            self.release(ctx, buffer);
            return Err(e);
        }
        Ok(Arena { buffer, words: words.max(1) })
    }

    fn staging(&mut self, ctx: &gpu::Context, download: bool, words: usize) -> Option<gpu::Buffer> {
        if words == 0 {
            return None;
        }
        let slot = if download { &mut self.download } else { &mut self.upload };
        if slot.as_ref().is_some_and(|s| s.words < words) {
            ctx.destroy_buffer(slot.take().expect("checked").buffer);
        }
        let memory = if download { gpu::Memory::Download } else { gpu::Memory::Upload };
        let s = slot.get_or_insert_with(|| Staging {
            buffer: ctx.create_buffer(gpu::BufferDesc {
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
    pub(super) fn submit(
        &mut self,
        ctx: &gpu::Context,
        arena: &Arena,
        job: &Submission,
    ) -> Result<Vec<Vec<u32>>, String> {
        job.check(arena.words)?;
        self.usable()?;
        let up_words: usize = job.uploads.iter().map(|(_, d)| d.len()).sum();
        if up_words > 2 * STAGE_WORDS {
            // Zeros first, as in one submission (an upload may land on zeroed words), then the
            // uploads through the two halves of a bounded staging buffer, then the rest.
            if !job.zeros.is_empty() {
                let zeros = Submission { zeros: job.zeros.clone(), ..Default::default() };
                self.submit(ctx, arena, &zeros)?;
            }
            self.stream(ctx, arena, &job.uploads)?;
            let rest = Submission {
                levels: job.levels.clone(),
                downloads: job.downloads.clone(),
                copies: job.copies.clone(),
                ..Default::default()
            };
            return self.submit(ctx, arena, &rest);
        }
        let down_words: usize = job.downloads.iter().map(|&(_, n)| n).sum();
        let up = self.staging(ctx, false, up_words);
        let down = self.staging(ctx, true, down_words);
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
        record_levels(ctx, enc, arena, &job.levels);
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
        let sp = ctx.submit(enc);
        self.wait(ctx, &sp)?;
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

    /// Copies `uploads` into the arena through a staging buffer of two `STAGE_WORDS` halves:
    /// while the GPU copies one half into the arena, this thread fills the other, so the host's
    /// copy and the bus overlap and the host-visible memory stays small whatever the upload
    /// (SmolLM2's parameters are 513 MB). Waits for the last copy.
    fn stream(
        &mut self,
        ctx: &gpu::Context,
        arena: &Arena,
        uploads: &[(usize, &[u32])],
    ) -> Result<(), String> {
        let Some(buffer) = self.staging(ctx, false, 2 * STAGE_WORDS) else { return Ok(()) };
        let mut pending: [Option<gpu::SyncPoint>; 2] = [None, None];
        // The half being filled, how much of it is, and its copies (staging word, arena word,
        // length).
        let (mut half, mut filled) = (0usize, 0usize);
        let mut copies: Vec<(usize, usize, usize)> = Vec::new();
        let mut flush = |copies: &mut Vec<(usize, usize, usize)>| {
            self.runs.start();
            let mut pass = self.runs.transfer("upload");
            for (from, to, len) in copies.drain(..) {
                pass.copy_buffer_to_buffer(
                    buffer.at(from as u64 * 4),
                    arena.buffer.at(to as u64 * 4),
                    len as u64 * 4,
                );
            }
            drop(pass);
            ctx.submit(&mut self.runs)
        };
        for &(offset, data) in uploads {
            let mut done = 0;
            while done < data.len() {
                if filled == STAGE_WORDS {
                    pending[half] = Some(flush(&mut copies));
                    (half, filled) = (1 - half, 0);
                }
                if filled == 0 {
                    if let Some(sp) = pending[half].take() {
                        wait(ctx, &sp, self.patience, &mut self.hung)?;
                    }
                }
                let n = (data.len() - done).min(STAGE_WORDS - filled);
                let at = half * STAGE_WORDS + filled;
                // SAFETY: `at + n` is inside the staging buffer (2 · STAGE_WORDS words), whose
                // half `half` no copy in flight reads (waited for above).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data[done..].as_ptr(),
                        (buffer.data() as *mut u32).add(at),
                        n,
                    )
                };
                copies.push((at, offset + done, n));
                (filled, done) = (filled + n, done + n);
            }
        }
        if !copies.is_empty() {
            pending[half] = Some(flush(&mut copies));
        }
        for sp in pending.iter().flatten() {
            wait(ctx, sp, self.patience, &mut self.hung)?;
        }
        Ok(())
    }

    /// GPU time of each dispatch of `levels` (in order), measured with timestamps between passes:
    /// one pass per dispatch, in submissions of at most `PASS_COUNT - 1` passes. Needs
    /// `MGN_PROFILE=1` when the device was opened. The extra barriers make the total slower
    /// than a real run; the split across dispatches is what it is for.
    pub(super) fn profile(
        &mut self,
        ctx: &gpu::Context,
        arena: &Arena,
        levels: &[Vec<Dispatch>],
    ) -> Result<Vec<std::time::Duration>, String> {
        if std::env::var("MGN_PROFILE").map_or(true, |v| v != "1") {
            return Err("profiling needs MGN_PROFILE=1 when the session opens".into());
        }
        self.usable()?;
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
            let sp = ctx.submit(&mut self.encoder);
            self.wait(ctx, &sp)?;
            // Timestamps of a submission are collected when the encoder starts again.
            self.encoder.start();
            let t = self.encoder.timings();
            out.extend(t.iter().take(part.len()).map(|(_, d)| *d));
            let sp = ctx.submit(&mut self.encoder);
            self.wait(ctx, &sp)?;
        }
        Ok(out)
    }
}

/// Waits for `sp`, at most `patience`; sets `hung` when it did not finish (`Queue::hung`).
fn wait(
    ctx: &gpu::Context,
    sp: &gpu::SyncPoint,
    patience: std::time::Duration,
    hung: &mut bool,
) -> Result<(), String> {
    let ms = patience.as_millis().min(u32::MAX as u128) as u32;
    let outcome = match ctx.wait_for(sp, ms) {
        Ok(true) => return Ok(()),
        Ok(false) => format!(
            "the GPU did not finish within {} s (MGN_GPU_TIMEOUT=SECONDS waits longer)",
            patience.as_secs_f64()
        ),
        Err(e) => format!("the GPU reported an error: {e:?}"),
    };
    *hung = true;
    Err(outcome)
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
