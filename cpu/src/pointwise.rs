//! Elementwise kernels: constants, unary functions and their derivatives, `pow`, broadcasting
//! binary arithmetic, casts, dropout, and the two broadcasting adjoints `BroadcastTo`/`SumTo`.

use super::float::{par_chunks, Float};
use super::layout::{broadcast_shapes, broadcast_strides, numel, strides, walk};
use super::{by_float, check_shape, err, floats, map_data, KResult};
use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::{DType, Data, Tensor};

/// Elements per parallel chunk of an elementwise kernel.
const CHUNK: usize = 1 << 14;

/// A scalar (or any shape) filled with `value`: `F32` storage for float dtypes, `I32` for
/// integer ones (the value truncated; `bool` is `value != 0`).
pub(crate) fn constant(value: f64, dtype: DType, shape: &[usize]) -> Data {
    let n = numel(shape);
    if dtype.is_float() {
        Data::F32(vec![value as f32; n])
    } else if dtype == DType::Bool {
        Data::I32(vec![(value != 0.0) as i32; n])
    } else {
        Data::I32(vec![value as i32; n])
    }
}

pub(crate) fn arange(shape: &[usize]) -> KResult<Data> {
    let &[n] = shape else {
        return err(format!("the result must be 1-D, the step says {shape:?}"));
    };
    if n > i32::MAX as usize {
        return err(format!("{n} elements do not fit i32 indices"));
    }
    Ok(Data::I32((0..n as i32).collect()))
}

// ---- unary ----------------------------------------------------------------------------------

// The functions themselves are `mgn_ir::pointwise`'s, shared with the compiler's constant
// folding; here they are mapped over tensors.

/// Applies `f` to every element of `x`, in parallel chunks.
fn map<T: Float>(x: &[T], f: impl Fn(T) -> T + Sync) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    par_chunks(&mut out, CHUNK, CHUNK * 4, |c, o| {
        for (o, &v) in o.iter_mut().zip(&x[c * CHUNK..]) {
            *o = f(v);
        }
    });
    out
}

pub(crate) fn unary(op: UnaryOp, x: &Tensor) -> KResult<Data> {
    if let Data::I32(v) = &x.data {
        // Integer tensors support the ops that stay integers (wrapping like PyTorch's int32).
        let f: fn(i32) -> i32 = match op {
            UnaryOp::Neg => i32::wrapping_neg,
            UnaryOp::Abs => i32::wrapping_abs,
            UnaryOp::Square => |v| v.wrapping_mul(v),
            _ => return err("needs a float tensor, found an integer one"),
        };
        return Ok(Data::I32(v.iter().map(|&v| f(v)).collect()));
    }
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| map(&v, |v| mgn_ir::pointwise::unary(op, v))))
}

/// `[x, dy]` → `dy · f'(x)`.
pub(crate) fn unary_grad(op: UnaryOp, x: &Tensor, dy: &Tensor) -> KResult<Data> {
    if x.shape != dy.shape {
        return err(format!("x {:?} and dy {:?} differ in shape", x.shape, dy.shape));
    }
    by_float!(&[x, dy], T => (|| {
        let (x, dy) = (floats::<T>(x, "x")?, floats::<T>(dy, "dy")?);
        let mut out = vec![T::zero(); x.len()];
        par_chunks(&mut out, CHUNK, CHUNK * 4, |c, o| {
            let base = c * CHUNK;
            for (i, o) in o.iter_mut().enumerate() {
                *o = dy[base + i] * mgn_ir::pointwise::derivative(op, x[base + i]);
            }
        });
        Ok(out)
    })())
}

pub(crate) fn pow(x: &Tensor, p: f64) -> KResult<Data> {
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| map(&v, |v| v.powf(T::of(p)))))
}

// ---- binary ---------------------------------------------------------------------------------

/// `a op b` with NumPy broadcasting (`op` is applied at every index of the result).
pub(crate) fn broadcast_apply<E: Copy + Default>(
    a: &[E],
    sa: &[usize],
    b: &[E],
    sb: &[usize],
    out_shape: &[usize],
    f: impl Fn(E, E) -> KResult<E>,
) -> KResult<Vec<E>> {
    if sa == sb {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    let (ta, tb) = (broadcast_strides(sa, out_shape)?, broadcast_strides(sb, out_shape)?);
    let mut out = Vec::with_capacity(numel(out_shape));
    let mut failure = None;
    walk(out_shape, [&ta, &tb], |[i, j]| match f(a[i], b[j]) {
        Ok(v) => out.push(v),
        Err(e) => {
            failure.get_or_insert(e);
            out.push(E::default());
        }
    });
    failure.map_or(Ok(out), Err)
}

pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Data> {
    let out_shape = broadcast_shapes(&a.shape, &b.shape)?;
    check_shape(&out_shape, shape)?;
    match (&a.data, &b.data) {
        (Data::I32(x), Data::I32(y)) => {
            // Integer arithmetic wraps like PyTorch's int32; division rounds down (Python `//`).
            let f = move |p: i32, q: i32| -> KResult<i32> {
                Ok(match op {
                    BinaryOp::Add => p.wrapping_add(q),
                    BinaryOp::Sub => p.wrapping_sub(q),
                    BinaryOp::Mul => p.wrapping_mul(q),
                    BinaryOp::Div if q == 0 => return err("integer division by zero"),
                    BinaryOp::Div => {
                        let (d, r) = (p.wrapping_div(q), p.wrapping_rem(q));
                        if r != 0 && (r < 0) != (q < 0) {
                            d - 1
                        } else {
                            d
                        }
                    }
                    BinaryOp::Maximum => p.max(q),
                    BinaryOp::Minimum => p.min(q),
                })
            };
            Ok(Data::I32(broadcast_apply(x, &a.shape, y, &b.shape, &out_shape, f)?))
        }
        (Data::I32(_), _) | (_, Data::I32(_)) => {
            err("cannot combine an integer tensor with a float one")
        }
        _ => by_float!(&[a, b], T => (|| {
            let f = |p: T, q: T| Ok(mgn_ir::pointwise::binary(op, p, q));
            let (x, y) = (floats::<T>(a, "a")?, floats::<T>(b, "b")?);
            broadcast_apply(&x, &a.shape, &y, &b.shape, &out_shape, f)
        })()),
    }
}

// ---- casts ----------------------------------------------------------------------------------

/// Rounds to the nearest bfloat16 (ties to even), kept in an f32.
fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
}

/// Rounds to the nearest IEEE half (ties to even; overflow to ±inf, subnormals kept), in an f32.
fn round_f16(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    if x.abs() >= 65520.0 {
        return f32::INFINITY.copysign(x);
    }
    if x.abs() < 2f32.powi(-14) {
        // Subnormal halves are multiples of 2^-24; scaling by powers of two is exact.
        return (x * 2f32.powi(24)).round_ties_even() / 2f32.powi(24);
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0xFFF + ((b >> 13) & 1)) & !0x1FFF)
}

/// Rounds float storage in place to the half type `dtype` (nothing for any other dtype).
pub(crate) fn round_to_half(data: &mut Data, dtype: DType) {
    let round: fn(f32) -> f32 = match dtype {
        DType::F16 => round_f16,
        DType::BF16 => round_bf16,
        _ => return,
    };
    match data {
        Data::F32(v) => v.iter_mut().for_each(|x| *x = round(*x)),
        Data::F64(v) => v.iter_mut().for_each(|x| *x = round(*x as f32) as f64),
        Data::I32(_) | Data::Packed(_) => {}
    }
}

/// Converts to `dtype`: floats to integers truncate toward zero (saturating; NaN → 0), to `bool`
/// test `!= 0`; to `f16`/`bf16` round to that precision (storage stays F32, or F64 for a gradient
/// check); integers to floats convert exactly where they can.
pub(crate) fn cast(x: &Tensor, dtype: DType) -> KResult<Data> {
    let round: fn(f32) -> f32 = match dtype {
        DType::F16 => round_f16,
        DType::BF16 => round_bf16,
        _ => |v| v,
    };
    Ok(match (&x.data, dtype.is_float()) {
        (Data::F32(v), true) => Data::F32(v.iter().map(|&v| round(v)).collect()),
        (Data::F64(v), true) if matches!(dtype, DType::F16 | DType::BF16) => {
            Data::F64(v.iter().map(|&v| round(v as f32) as f64).collect())
        }
        (Data::F64(v), true) => Data::F64(v.clone()),
        (Data::I32(v), true) => Data::F32(v.iter().map(|&v| round(v as f32)).collect()),
        (Data::I32(v), false) if dtype == DType::Bool => {
            Data::I32(v.iter().map(|&v| (v != 0) as i32).collect())
        }
        (Data::I32(v), false) => Data::I32(v.clone()),
        (Data::F32(v), false) if dtype == DType::Bool => {
            Data::I32(v.iter().map(|&v| (v != 0.0) as i32).collect())
        }
        (Data::F64(v), false) if dtype == DType::Bool => {
            Data::I32(v.iter().map(|&v| (v != 0.0) as i32).collect())
        }
        (Data::F32(v), false) => Data::I32(v.iter().map(|&v| v as i32).collect()),
        (Data::F64(v), false) => Data::I32(v.iter().map(|&v| v as i32).collect()),
        (Data::Packed(_), _) => return err(crate::PACKED_ONLY_DEQUANTIZED),
    })
}

// ---- dropout --------------------------------------------------------------------------------

fn splitmix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether dropout keeps element `index` (row-major) of step `node`'s output:
/// `u = top 53 bits of splitmix64(splitmix64(splitmix64(seed) ^ node) ^ index) / 2^53`,
/// kept when `u >= p`. Every backend must draw the same mask from the same recipe.
pub fn dropout_keep(seed: u64, node: u32, index: u64, p: f64) -> bool {
    let h = splitmix64(splitmix64(splitmix64(seed) ^ node as u64) ^ index);
    let u = (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    u >= p
}

/// Dropout of `x` (or, with `node` = the forward step, its derivative applied to `dy`: the same
/// mask and scale). Kept elements are scaled by `1/(1−p)`. The identity outside training.
pub(crate) fn dropout(x: &Tensor, p: f64, training: bool, seed: u64, node: u32) -> KResult<Data> {
    if !(0.0..1.0).contains(&p) {
        return err(format!("dropout probability must be in [0, 1), found {p}"));
    }
    by_float!(&[x], T => (|| {
        let x = floats::<T>(x, "x")?;
        if !training || p == 0.0 {
            return Ok(x.into_owned());
        }
        let scale = T::of(1.0 / (1.0 - p));
        let mut out = vec![T::zero(); x.len()];
        par_chunks(&mut out, CHUNK, CHUNK * 4, |c, o| {
            for (i, o) in o.iter_mut().enumerate() {
                let at = c * CHUNK + i;
                *o = if dropout_keep(seed, node, at as u64, p) { x[at] * scale } else { T::zero() };
            }
        });
        Ok(out)
    })())
}

// ---- broadcasting adjoints ------------------------------------------------------------------

/// `x` broadcast to `shape` (NumPy rules); any storage.
pub(crate) fn broadcast_to(x: &Tensor, shape: &[usize]) -> KResult<Data> {
    let st = broadcast_strides(&x.shape, shape)?;
    Ok(map_data!(&x.data, v => {
        let mut out = Vec::with_capacity(numel(shape));
        walk(shape, [&st], |[i]| out.push(v[i]));
        out
    }))
}

/// `dy` summed down to `shape`, which must broadcast to `dy`'s shape: the leading axes that
/// broadcasting added are summed away, the size-1 axes it stretched are summed with keepdim.
pub(crate) fn sum_to(dy: &Tensor, shape: &[usize]) -> KResult<Data> {
    let st = broadcast_strides(shape, &dy.shape)?;
    by_float!(&[dy], T => (|| {
        let v = floats::<T>(dy, "dy")?;
        let mut acc = vec![0f64; numel(shape)];
        walk(&dy.shape, [&strides(&dy.shape), &st], |[i, o]| acc[o] += v[i].f64());
        Ok(acc.into_iter().map(T::of).collect::<Vec<T>>())
    })())
}
