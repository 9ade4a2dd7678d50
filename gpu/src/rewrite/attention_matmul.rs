//! Long attentions computed through their score matrix: matrix products and row kernels
//! instead of the tiled attention kernels.
//!
//! The tiled kernels (`kernels/attention/`) never hold a `Tq × Tk` score matrix, which is
//! what short sequences and decoding want, but their derivatives re-score every key block
//! against every query with scalar loops. At Whisper's 1,500 positions the score matrix is
//! 54 MB per layer — memory the GPU has — and the products around it are plain batched
//! GEMMs, which the register-tiled matmul kernel runs several times faster. So an attention
//! whose sequences are long becomes, with `g = Hq / Hkv` query heads per KV head (their rows
//! lie next to each other, so q viewed as `[B·Hkv, g·Tq, D]` meets k `[B·Hkv, Tk, D]` with
//! no copy):
//!
//! ```text
//! S  = scale · q kᵀ            MatMulT { tb }            [B·Hkv, g·Tq, Tk]
//! P  = softmax(S + mask)       AttentionProbs            causal keys hidden
//! out = P v                    MatMulT
//! dP = dy vᵀ                   MatMulT { tb }
//! dS = P ∘ (dP − Σ_j P·dP)     SoftmaxGrad               the mask's derivative as it is
//! dq = scale · dS k,  dk = scale · dSᵀ q,  dv = Pᵀ dy    MatMulT { ta } for the last two
//! ```
//!
//! The forward's `P` is kept for the derivatives of the same attention; `dS` is made once for
//! dq, dk and the mask (a learned bias), so the scale goes into dq's and dk's products rather
//! than into dP, where it would scale the mask's derivative too. Every original step keeps its
//! id, becoming a reshape of its product, so results and readers are untouched.

use crate::kernels::{runs_on_tensor_cores, Target};
use crate::program::{GpuOp, Program, Step, StepId};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::shape::attention::{dims, Dims};
use mgn_ir::shape::broadcast_strides;
use mgn_ir::DType;

/// Which way attention runs on the GPU: `Auto` always, decided on the H200 (below, `LONG`;
/// docs/benchmarks/2026-12-05.md and 2026-12-07.md): the score matrix won where both sequences
/// are long (Whisper's 1,500 positions 3.12 ms against 3.34 whole), tied at 128 tokens, and
/// lost at one token, where the whole kernel makes one dispatch of four. The other paths are a
/// test's parameter (`rewrite::Options`), to reach each kernel; `MGN_ATTENTION`, the switch
/// that chose them, is gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPath {
    /// Through the score matrix when both sequences are long (`LONG`) and it is small enough
    /// (`MAX_SCORE_BYTES`), else tiled.
    #[default]
    Auto,
    /// Always the tiled kernels.
    Tiled,
    /// Always through the score matrix.
    Matmul,
    /// As `Auto`, but an f16 attention nothing differentiates runs whole where the device's
    /// cooperative matrices take it (`kernels/attention/coop.rs`). Measured on an H100 it lost
    /// (Whisper's mixed forward 2.39 ms against 2.15, docs/benchmarks/2026-12-06.md): no
    /// session takes it; tests reach it, for the tensor-core attention that issue 50 asks for.
    Tiles,
}

/// Both sequences at least this long take the score-matrix path under `Auto`. Measured on the
/// H200 (docs/benchmarks/): at 128 positions it is already faster (SmolLM2's
/// forward + backward 44.1 → 36.3 ms, MiniLM's 7.96 → 7.08 ms), at one token slower (SmolLM2
/// 2.55 → 3.11 ms: four small dispatches where the tiled kernel makes one).
const LONG: usize = 16;
/// ... as long as one score matrix (all batch items and heads) stays within this.
const MAX_SCORE_BYTES: usize = 256 << 20;

fn wanted(path: AttentionPath, d: &Dims) -> bool {
    match path {
        AttentionPath::Tiled => false,
        AttentionPath::Matmul => true,
        AttentionPath::Auto | AttentionPath::Tiles => {
            // Checked: a score matrix past the address space (`--set frames=4294967295`) is
            // simply not wanted, and must not overflow on the way.
            let elements = d.scores.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
            let bytes = elements.map_or(usize::MAX, |n| n.saturating_mul(4));
            d.tq >= LONG && d.tk >= LONG && bytes <= MAX_SCORE_BYTES
        }
    }
}

/// What one attention (its q, k, v, mask and attributes) has made so far.
struct Group {
    key: (Vec<StepId>, bool, u64),
    d: Dims,
    /// q and k viewed as `[B·Hkv, g·Tq, D]` and `[B·Hkv, Tk, D]`; v as `[B·Hkv, Tk, Dv]`.
    q3: StepId,
    k3: StepId,
    v3: StepId,
    /// The probabilities as `[B·Hkv, g·Tq, Tk]`, and with the scores' own shape.
    p3: StepId,
    p: StepId,
    /// `dS` as `[B·Hkv, g·Tq, Tk]`, per upstream derivative `dy`.
    ds: Vec<(StepId, StepId)>,
}

/// Rewrites the attentions `path` picks (see the module header). Under `Tiles`, on a device
/// (`target`) whose cooperative matrices run an f16 attention's forward whole
/// (`kernels::runs_on_tensor_cores`), an attention nothing differentiates stays whole as
/// `GpuOp::AttentionOnTiles`: both of its products on the tiles and no score matrix stored,
/// where through the scores its probabilities (f32, as the policy keeps them) would make `P·v`
/// a product at the f32 rate.
pub(super) fn materialise_attention(
    program: &mut Program,
    path: AttentionPath,
    target: Option<Target>,
) {
    // Only the tiles path asks which attentions are differentiated.
    let differentiated =
        if path == AttentionPath::Tiles { differentiated(program) } else { vec![] };
    let mut groups: Vec<Group> = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let (causal, scale, has_mask, part) = match s.op {
            GpuOp::Plan(Op::Attention { causal, scale, has_mask }) => {
                (causal, scale, has_mask, None)
            }
            GpuOp::Plan(Op::AttentionGrad { causal, scale, has_mask, part }) => {
                (causal, scale, has_mask, Some(part))
            }
            _ => continue,
        };
        let operands = 3 + has_mask as usize;
        if s.inputs.len() != operands + part.is_some() as usize {
            continue; // malformed: the kernel generator says so
        }
        let x: Vec<StepId> = s.inputs[..operands].to_vec();
        let Some(d) = fits(program, id, &x, has_mask) else { continue };
        let key = (x.clone(), causal, scale.to_bits());
        let dtype = program.step(x[0]).dtype;
        let on_tiles = path == AttentionPath::Tiles
            && part.is_none()
            && !differentiated.contains(&key)
            && target.is_some_and(|t| runs_on_tensor_cores(&d, dtype, &t));
        let through_scores = || (wanted(path, &d) && !on_tiles) as usize;
        if program.choose("attention through its scores", id, through_scores) == 0 {
            if on_tiles {
                program.step_mut(id).op = GpuOp::AttentionOnTiles { causal, scale, has_mask };
            }
            continue;
        }
        let g = match groups.iter().position(|g| g.key == key) {
            Some(g) => g,
            None => {
                let group = probabilities(program, id, key, d, (causal, scale, has_mask));
                groups.push(group);
                groups.len() - 1
            }
        };
        let product = match part {
            None => {
                let g = &groups[g];
                let shape = vec![g.d.batch * g.d.hkv, g.d.hq / g.d.hkv * g.d.tq, g.d.dv];
                matmul(program, id, (g.p3, g.v3), (false, false, 1.0), shape)
            }
            Some(part) => {
                let dy = program.step(id).inputs[operands];
                let ds3 = score_grad(program, id, &mut groups[g], dy);
                let g = &groups[g];
                let (bh, rows) = (g.d.batch * g.d.hkv, g.d.hq / g.d.hkv * g.d.tq);
                match part {
                    GradPart::Q => matmul(
                        program,
                        id,
                        (ds3, g.k3),
                        (false, false, scale),
                        vec![bh, rows, g.d.d],
                    ),
                    GradPart::K => matmul(
                        program,
                        id,
                        (ds3, g.q3),
                        (true, false, scale),
                        vec![bh, g.d.tk, g.d.d],
                    ),
                    // dS is the mask's derivative: the step becomes a view of it.
                    GradPart::Mask => ds3,
                    GradPart::V => {
                        let dy3 = view(program, id, dy, vec![bh, rows, g.d.dv]);
                        matmul(
                            program,
                            id,
                            (g.p3, dy3),
                            (true, false, 1.0),
                            vec![bh, g.d.tk, g.d.dv],
                        )
                    }
                    _ => continue, // attention has no other derivative
                }
            }
        };
        let s = program.step_mut(id);
        s.op = GpuOp::Plan(Op::Reshape);
        s.inputs = vec![product];
    }
}

/// The (q, k, v, mask; causal, scale) of every attention some step differentiates.
fn differentiated(program: &Program) -> Vec<(Vec<StepId>, bool, u64)> {
    let mut keys = Vec::new();
    for &id in program.order() {
        let s = program.step(id);
        if let GpuOp::Plan(Op::AttentionGrad { causal, scale, has_mask, .. }) = s.op {
            let operands = (3 + has_mask as usize).min(s.inputs.len());
            keys.push((s.inputs[..operands].to_vec(), causal, scale.to_bits()));
        }
    }
    keys
}

/// The attention's dims when it computes an f32 result from q, k and v of one float type (f32,
/// or a half type under the mixed precision policy: the products read them as they are, and
/// the probabilities stay f32, as the CPU's attention keeps them), an f32 mask that broadcasts
/// to the scores.
fn fits(program: &Program, id: StepId, x: &[StepId], has_mask: bool) -> Option<Dims> {
    let step = |i: usize| program.step(x[i]);
    let t = step(0).dtype;
    let operands = (t == DType::F32 || t.is_half()) && (1..3).all(|i| step(i).dtype == t);
    let mask = !has_mask || step(3).dtype == DType::F32;
    if !operands || !mask || program.step(id).dtype != DType::F32 {
        return None;
    }
    let d = dims(&step(0).shape, &step(1).shape, &step(2).shape).ok()?;
    if has_mask && broadcast_strides(&step(3).shape, &d.scores).is_err() {
        return None;
    }
    Some(d)
}

/// A view of `of` with `shape` (and its type), inserted before `at`.
fn view(program: &mut Program, at: StepId, of: StepId, shape: Vec<usize>) -> StepId {
    let loc = program.step(at).loc.clone();
    let dtype = program.step(of).dtype;
    let step = Step { op: GpuOp::Plan(Op::Reshape), inputs: vec![of], dtype, shape, loc };
    program.insert_before(at, step)
}

fn insert(
    program: &mut Program,
    at: StepId,
    op: GpuOp,
    inputs: Vec<StepId>,
    shape: Vec<usize>,
) -> StepId {
    let loc = program.step(at).loc.clone();
    program.insert_before(at, Step { op, inputs, dtype: DType::F32, shape, loc })
}

/// `alpha · op(a) · op(b)` of `shape`, inserted before `at`.
fn matmul(
    program: &mut Program,
    at: StepId,
    (a, b): (StepId, StepId),
    (ta, tb, alpha): (bool, bool, f64),
    shape: Vec<usize>,
) -> StepId {
    insert(program, at, GpuOp::MatMulT { ta, tb, alpha, splits: 1 }, vec![a, b], shape)
}

/// The views of q, k and v and the probabilities of the attention `key` names, inserted
/// before `at`.
fn probabilities(
    program: &mut Program,
    at: StepId,
    key: (Vec<StepId>, bool, u64),
    d: Dims,
    (causal, scale, has_mask): (bool, f64, bool),
) -> Group {
    let x = key.0.clone();
    let (bh, rows) = (d.batch * d.hkv, d.hq / d.hkv * d.tq);
    let q3 = view(program, at, x[0], vec![bh, rows, d.d]);
    let k3 = view(program, at, x[1], vec![bh, d.tk, d.d]);
    let v3 = view(program, at, x[2], vec![bh, d.tk, d.dv]);
    let s3 = matmul(program, at, (q3, k3), (false, true, scale), vec![bh, rows, d.tk]);
    let s = view(program, at, s3, d.scores.clone());
    let mut inputs = vec![s];
    if has_mask {
        inputs.push(x[3]);
    }
    let probs = GpuOp::AttentionProbs { causal, has_mask };
    let p = insert(program, at, probs, inputs, d.scores.clone());
    let p3 = view(program, at, p, vec![bh, rows, d.tk]);
    Group { key, d, q3, k3, v3, p3, p, ds: Vec::new() }
}

/// `dS` of the group's attention under the upstream derivative `dy`, as `[B·Hkv, g·Tq, Tk]`:
/// made before `at` the first time it is needed.
fn score_grad(program: &mut Program, at: StepId, g: &mut Group, dy: StepId) -> StepId {
    if let Some(&(_, ds3)) = g.ds.iter().find(|(y, _)| *y == dy) {
        return ds3;
    }
    let d = &g.d;
    let (bh, rows) = (d.batch * d.hkv, d.hq / d.hkv * d.tq);
    let dy3 = view(program, at, dy, vec![bh, rows, d.dv]);
    let dp3 = matmul(program, at, (dy3, g.v3), (false, true, 1.0), vec![bh, rows, d.tk]);
    let dp = view(program, at, dp3, d.scores.clone());
    let axis = d.scores.len() - 1;
    let grad = GpuOp::Plan(Op::SoftmaxGrad { axis, log: false });
    let ds = insert(program, at, grad, vec![g.p, dp], d.scores.clone());
    let ds3 = view(program, at, ds, vec![bh, rows, d.tk]);
    g.ds.push((dy, ds3));
    ds3
}
