//! Comparisons and selection: `compare` (to a `bool` tensor, stored as I32 0/1) and `where`.

use super::layout::{broadcast_shapes, broadcast_strides, walk};
use super::pointwise::broadcast_apply;
use super::{by_float, check_shape, err, floats, ints, KResult};
use mgn_ir::op::CompareOp;
use mgn_ir::{Data, Tensor};

/// `a op b` with NumPy broadcasting: 1 where it holds, else 0.
pub(crate) fn compare(op: CompareOp, a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Data> {
    let out = broadcast_shapes(&a.shape, &b.shape)?;
    check_shape(&out, shape)?;
    let bit = |holds: bool| Ok(holds as i32);
    let v = match (&a.data, &b.data) {
        (Data::I32(x), Data::I32(y)) => {
            broadcast_apply(x, &a.shape, y, &b.shape, &out, |p, q| bit(op.holds(p, q)))?
        }
        (Data::I32(_), _) | (_, Data::I32(_)) => {
            return err("cannot compare an integer tensor with a float one")
        }
        _ => {
            // Compared in f64: exact for f32 operands, and the same order.
            let (x, y) = (floats::<f64>(a, "a")?, floats::<f64>(b, "b")?);
            let (sa, sb) = (broadcast_strides(&a.shape, &out)?, broadcast_strides(&b.shape, &out)?);
            let mut v = Vec::with_capacity(x.len().max(y.len()));
            walk(&out, [&sa, &sb], |[i, j]| v.push(op.holds(x[i], y[j]) as i32));
            v
        }
    };
    Ok(Data::I32(v))
}

/// `a` where `cond` is non-zero, else `b`, the three broadcast to `shape`.
pub(crate) fn where_(cond: &Tensor, a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Data> {
    let out = broadcast_shapes(&cond.shape, &broadcast_shapes(&a.shape, &b.shape)?)?;
    check_shape(&out, shape)?;
    let c = ints(cond, "the condition")?;
    let st = [&cond.shape, &a.shape, &b.shape].map(|s| broadcast_strides(s, &out));
    let [sc, sa, sb] = st;
    let strides = [sc?, sa?, sb?];
    match (&a.data, &b.data) {
        (Data::I32(x), Data::I32(y)) => Ok(Data::I32(select(c, x, y, &out, &strides))),
        (Data::I32(_), _) | (_, Data::I32(_)) => {
            err("cannot select between an integer tensor and a float one")
        }
        _ => by_float!(&[a, b], T => (|| {
            let (x, y) = (floats::<T>(a, "a")?, floats::<T>(b, "b")?);
            Ok(select(c, &x, &y, &out, &strides))
        })()),
    }
}

fn select<E: Copy>(c: &[i32], x: &[E], y: &[E], out: &[usize], st: &[Vec<usize>; 3]) -> Vec<E> {
    let mut v = Vec::with_capacity(mgn_ir::shape::numel(out));
    walk(out, [&st[0], &st[1], &st[2]], |[k, i, j]| v.push(if c[k] != 0 { x[i] } else { y[j] }));
    v
}
