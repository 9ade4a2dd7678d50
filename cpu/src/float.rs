//! The float element trait the kernels are generic over, the GEMM behind every matrix product,
//! and the one helper that spreads work over the cores.

use mgn_ir::Data;
use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};
use std::sync::OnceLock;

/// `f32` or `f64`: every float kernel is written once against this trait.
pub(crate) trait Float:
    num_traits::Float
    + num_traits::FloatConst
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The elements of `d` if it is stored as this type.
    fn view(d: &Data) -> Option<&[Self]>;
    /// Wraps elements as tensor storage.
    fn wrap(v: Vec<Self>) -> Data;
    /// `v` as f32 values, when this type is f32: where a kernel fills f32 values in place
    /// (the packed decoders) rather than through a copy.
    fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]>;
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
    /// `C ← α·A·B + β·C` on raw strided matrices (see [`gemm`], the safe entry point).
    ///
    /// # Safety
    /// Every element addressed by the dimensions and strides must lie inside the allocations.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

impl Float for f32 {
    fn view(d: &Data) -> Option<&[f32]> {
        match d {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }
    fn wrap(v: Vec<f32>) -> Data {
        Data::F32(v)
    }
    fn as_f32_mut(v: &mut [f32]) -> Option<&mut [f32]> {
        Some(v)
    }
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        beta: f32,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
    }
}

impl Float for f64 {
    fn view(d: &Data) -> Option<&[f64]> {
        match d {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }
    fn wrap(v: Vec<f64>) -> Data {
        Data::F64(v)
    }
    fn as_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
        None
    }
    fn of(x: f64) -> f64 {
        x
    }
    fn f64(self) -> f64 {
        self
    }
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        beta: f64,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
    }
}

/// A strided matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    pub fn new(data: &'a [T], rs: usize, cs: usize) -> Self {
        Mat { data, rs, cs }
    }
    /// The transpose, for free.
    pub fn t(self) -> Self {
        Mat { data: self.data, rs: self.cs, cs: self.rs }
    }
}

/// Index of the last element of an `rows × cols` matrix with these strides.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    (rows - 1) * rs + (cols - 1) * cs
}

/// `C ← α·A·B + β·C` with `A: m × k`, `B: k × n`, `C: m × n` (row-major with row stride `ldc`).
/// With `β = 0` the old contents of `C` are ignored (even NaN). Bounds are checked here, so the
/// unsafe call below is sound; the kernels always pass in-bounds views, so a failed check is a bug.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: Mat<T>,
    b: Mat<T>,
    beta: T,
    c: &mut [T],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && extent(m, n, ldc, 1) < c.len(), "gemm: C out of bounds");
    if k == 0 {
        for i in 0..m {
            for v in &mut c[i * ldc..i * ldc + n] {
                *v = if beta == T::zero() { T::zero() } else { *v * beta };
            }
        }
        return;
    }
    assert!(extent(m, k, a.rs, a.cs) < a.data.len(), "gemm: A out of bounds");
    assert!(extent(k, n, b.rs, b.cs) < b.data.len(), "gemm: B out of bounds");
    // SAFETY: the three asserts above keep every addressed element inside its slice, and `c`
    // is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        )
    }
}

/// How many threads the kernels use: the machine's cores (`MGN_CPU_THREADS` overrides).
pub fn threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let env = std::env::var("MGN_CPU_THREADS").ok().and_then(|s| s.parse().ok());
        env.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1)
    })
}

/// Below this many (rough) operations a kernel runs on the calling thread: spawning costs more.
/// Debug tests use a small threshold, so that their small shapes also run the threaded paths.
const PARALLEL_WORK: usize = if cfg!(all(test, debug_assertions)) { 1 << 9 } else { 1 << 17 };

/// The pool the kernels' parallel parts run on: [`threads`] workers, started once and kept. A
/// decoded token runs a few hundred small parallel steps; starting threads for each would cost
/// more than some of them take.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let build = || {
        let named = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("mgn-cpu-{i}"));
        // A system that refuses threads leaves the kernels on the caller's thread.
        named.num_threads(threads()).build().ok()
    };
    POOL.get_or_init(build).as_ref()
}

/// Splits `out` into consecutive chunks of `chunk` elements and calls `f(chunk_index, chunk)`
/// for each, spread over the cores when `work_per_chunk × chunks` is large enough. Each call
/// owns its chunk, so kernels that write disjoint output regions parallelize without locks.
/// Each core gets one run of consecutive chunks (the same split every time).
pub(crate) fn par_chunks<T: Send>(
    out: &mut [T],
    chunk: usize,
    work_per_chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if chunk == 0 || out.is_empty() {
        return;
    }
    let count = out.len().div_ceil(chunk);
    let threads = threads().min(count);
    let serial = threads <= 1 || count.saturating_mul(work_per_chunk) < PARALLEL_WORK;
    let Some(pool) = (if serial { None } else { pool() }) else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        return;
    };
    let per_thread = count.div_ceil(threads);
    pool.scope(|s| {
        for (t, part) in out.chunks_mut(per_thread * chunk).enumerate() {
            let f = &f;
            s.spawn(move |_| {
                for (i, c) in part.chunks_mut(chunk).enumerate() {
                    f(t * per_thread + i, c);
                }
            });
        }
    });
}
