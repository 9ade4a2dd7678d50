//! The builtin functions: one typing rule each, and the graph node(s) each one produces.
//!
//! Arguments are bound by name against each builtin's parameter list (`?` marks an optional
//! one); the rule then checks kinds, dtypes and shapes and names the argument at fault.

mod args;
mod attention;
mod conv;
mod counter;
mod einsum;
mod fill;
mod given;
mod init;
mod loss;
mod pointwise;
mod reduce;
mod scan;
mod select;
mod shapes;
mod spatial;
mod transpose;
mod window;

pub use args::{call, read, signature, Args};
pub use pointwise::{elementwise, matmul};
pub use select::{compare, logic, not};
pub use shapes::swap_axes;

use super::value::Value;
use crate::elab::eval::{Evaluator, R};
use crate::graph::{BinaryOp, InitSpec, PoolOp, ReduceOp, UnaryOp};
use attention::*;
use conv::*;
use einsum::*;
use fill::*;
use given::*;
use init::*;
use pointwise::*;
use reduce::*;
use scan::*;
use select::*;
use shapes::*;
use spatial::*;
use transpose::*;
use window::*;

/// The builtin whose argument is evaluated with its contractions kept in f32.
pub const FULL_PRECISION: &str = "full_precision";

pub struct Builtin {
    pub name: &'static str,
    /// Parameter names; a trailing `?` marks an optional one.
    pub params: &'static [&'static str],
    pub doc: &'static str,
    run: fn(&mut Evaluator, &Args) -> R<Value>,
    /// For a builtin value (`training`), read by its name and never called: its type.
    pub value: Option<&'static str>,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "builtin {}", self.name)
    }
}

macro_rules! b {
    ($name:literal, [$($p:literal),*], $doc:literal, $run:expr) => {
        Builtin { name: $name, params: &[$($p),*], doc: $doc, run: $run, value: None }
    };
}

/// Einstein summation, whose arguments are a spec and its operands.
pub const EINSUM: &str = "einsum";

/// The builtin that gives a parameter a second checkpoint name: `name = tied(p)`.
pub const TIED: &str = "tied";

/// The builtin value whose name is the plan's mode: true while building a training plan.
pub const TRAINING: &str = "training";

static BUILTINS: &[Builtin] = &[
    // pointwise
    b!("relu", ["x"], "max(x, 0)", |e, a| unary(e, a, UnaryOp::Relu)),
    b!("gelu", ["x"], "GELU with the exact erf form", |e, a| unary(e, a, UnaryOp::Gelu)),
    b!("gelu_tanh", ["x"], "GELU with the tanh approximation", |e, a| unary(
        e,
        a,
        UnaryOp::GeluTanh
    )),
    b!("silu", ["x"], "x * sigmoid(x)", |e, a| unary(e, a, UnaryOp::Silu)),
    b!("sigmoid", ["x"], "1 / (1 + exp(-x))", |e, a| unary(e, a, UnaryOp::Sigmoid)),
    b!("tanh", ["x"], "hyperbolic tangent", |e, a| unary(e, a, UnaryOp::Tanh)),
    b!("exp", ["x"], "e^x", |e, a| unary(e, a, UnaryOp::Exp)),
    b!("log", ["x"], "natural logarithm", |e, a| unary(e, a, UnaryOp::Log)),
    b!("sqrt", ["x"], "square root", |e, a| unary(e, a, UnaryOp::Sqrt)),
    b!("rsqrt", ["x"], "1 / sqrt(x)", |e, a| unary(e, a, UnaryOp::Rsqrt)),
    b!("abs", ["x"], "absolute value", |e, a| unary(e, a, UnaryOp::Abs)),
    b!("sin", ["x"], "sine", |e, a| unary(e, a, UnaryOp::Sin)),
    b!("cos", ["x"], "cosine", |e, a| unary(e, a, UnaryOp::Cos)),
    b!("square", ["x"], "x * x", |e, a| unary(e, a, UnaryOp::Square)),
    b!("erf", ["x"], "the error function", |e, a| unary(e, a, UnaryOp::Erf)),
    b!("log1p", ["x"], "log(1 + x), accurate for small x", |e, a| unary(e, a, UnaryOp::Log1p)),
    b!("expm1", ["x"], "exp(x) - 1, accurate for small x", |e, a| unary(e, a, UnaryOp::Expm1)),
    b!(
        "softplus",
        ["x", "beta?", "threshold?"],
        "log(1 + exp(beta * x)) / beta, and x where beta * x > threshold (1 and 20 by default)",
        softplus
    ),
    b!("pow", ["x", "p"], "x raised to a constant power p", pow),
    b!("cast", ["x", "dtype"], "converts the element type", cast),
    b!(
        "stop_gradient",
        ["x"],
        "x itself, through which no gradient flows (PyTorch's `detach`)",
        stop_gradient
    ),
    b!(
        "full_precision",
        ["x", "derivatives?"],
        "x itself, with every matrix product, convolution and attention computed for it (and \
         their derivatives, unless `derivatives = false`) kept in f32 under `--precision mixed`",
        |e, a| {
            a.bool_or(e, "derivatives", true)?;
            Ok(a.raw("x").0)
        }
    ),
    b!("float", ["x"], "a compile-time number as a float", |e, a| Ok(Value::Float(
        a.number(e, "x")?
    ))),
    b!("int", ["x"], "a compile-time number as an integer (truncating)", int_of),
    b!("floor_div", ["a", "b"], "integer division rounding down", |e, a| int_div(e, a, false)),
    b!("ceil_div", ["a", "b"], "integer division rounding up", |e, a| int_div(e, a, true)),
    // shapes
    b!("matmul", ["a", "b"], "matrix product, same as `a @ b`", |e, a| {
        let (x, y) = (a.raw("a"), a.raw("b"));
        matmul(e, (&x.0, x.1), (&y.0, y.1), a.span).map(Value::Tensor)
    }),
    b!(
        "einsum",
        ["spec", "a", "b?"],
        "Einstein summation over one or two tensors: \"bij,bjk->bik\", \"bhqd,bhkd->bhqk\", \
         \"i,j->ij\", \"ij->ji\", \"ij->\"",
        einsum
    ),
    b!("transpose", ["x", "a?", "b?"], "swaps two axes (the last two by default)", transpose),
    b!("permute", ["x", "axes"], "reorders all axes", permute),
    b!("reshape", ["x", "shape"], "same elements, new shape; one -1 is inferred", reshape),
    b!("unsqueeze", ["x", "axis"], "inserts a size-1 axis", unsqueeze),
    b!("squeeze", ["x", "axis"], "removes a size-1 axis", squeeze),
    b!(
        "flatten",
        ["x", "start?", "end?"],
        "merges axes start..=end (1 and -1 by default)",
        flatten
    ),
    b!("concat", ["tensors", "axis?"], "joins tensors along an axis (0 by default)", concat),
    b!(
        "split",
        ["x", "parts", "axis?"],
        "splits into a count of equal parts or a list of sizes; returns a tuple",
        split
    ),
    b!("slice", ["x", "axis", "start", "end"], "elements start..end along an axis", slice),
    b!(
        "narrow",
        ["x", "axis", "start", "length"],
        "`length` elements from `start` along an axis; `start` may be a run-time i32 tensor",
        narrow
    ),
    b!(
        "slice_scatter",
        ["x", "src", "axis", "start"],
        "`x` with `src` written from `start` along an axis (a KV-cache write)",
        slice_scatter
    ),
    b!("gather", ["x", "index", "axis?"], "selects along an axis by an integer tensor", gather),
    b!("embedding", ["weight", "ids"], "rows of `weight` selected by integer `ids`", embedding),
    b!("arange", ["n"], "i32[n] holding 0 … n-1", arange),
    // reductions
    b!("sum", ["x", "axis?", "keepdim?"], "sum over axes (all by default)", |e, a| reduce(
        e,
        a,
        ReduceOp::Sum
    )),
    b!("mean", ["x", "axis?", "keepdim?"], "mean over axes (all by default)", |e, a| reduce(
        e,
        a,
        ReduceOp::Mean
    )),
    b!("max", ["x", "axis?", "keepdim?"], "maximum over axes (all by default)", |e, a| reduce(
        e,
        a,
        ReduceOp::Max
    )),
    b!("min", ["x", "axis?", "keepdim?"], "minimum over axes (all by default)", |e, a| reduce(
        e,
        a,
        ReduceOp::Min
    )),
    b!("argmax", ["x", "axis?"], "index of the maximum along an axis, as i32", argmax),
    b!("softmax", ["x", "axis?"], "softmax along an axis (the last by default)", |e, a| softmax(
        e, a, false
    )),
    b!(
        "log_softmax",
        ["x", "axis?"],
        "log of softmax along an axis (the last by default)",
        |e, a| softmax(e, a, true)
    ),
    // normalization
    b!(
        "layer_norm",
        ["x", "weight?", "bias?", "eps?"],
        "normalizes over the last axis",
        layer_norm
    ),
    b!(
        "rms_norm",
        ["x", "weight?", "eps?"],
        "divides by the root mean square over the last axis",
        rms_norm
    ),
    b!(
        "group_norm",
        ["x", "groups", "weight?", "bias?", "eps?"],
        "normalizes groups of channels of [N, C, ...]",
        group_norm
    ),
    b!(
        "batch_norm",
        ["x", "running_mean", "running_var", "weight?", "bias?", "momentum?", "eps?", "tracked?"],
        "batch normalization over [N, C, ...]; `tracked`, an integer scalar buffer, counts the \
         training steps (PyTorch's num_batches_tracked)",
        batch_norm
    ),
    b!(
        "dropout",
        ["x", "p?"],
        "zeroes elements with probability p in training; identity in inference",
        dropout
    ),
    // convolution and resampling
    b!(
        "conv1d",
        ["x", "weight", "bias?", "stride?", "padding?", "dilation?", "groups?"],
        "1-D convolution of [N, Cin, L]",
        |e, a| conv(e, a, 1)
    ),
    b!(
        "conv2d",
        ["x", "weight", "bias?", "stride?", "padding?", "dilation?", "groups?"],
        "2-D convolution of [N, Cin, H, W]",
        |e, a| conv(e, a, 2)
    ),
    b!(
        "conv_transpose1d",
        ["x", "weight", "bias?", "stride?", "padding?", "output_padding?", "groups?", "dilation?"],
        "1-D transposed convolution of [N, Cin, L]; weight [Cin, Cout / groups, K]",
        |e, a| conv_transpose(e, a, 1)
    ),
    b!(
        "conv_transpose2d",
        ["x", "weight", "bias?", "stride?", "padding?", "output_padding?", "groups?", "dilation?"],
        "2-D transposed convolution of [N, Cin, H, W]; weight [Cin, Cout / groups, Kh, Kw]",
        |e, a| conv_transpose(e, a, 2)
    ),
    b!(
        "max_pool1d",
        ["x", "kernel", "stride?", "padding?"],
        "1-D max pooling of [N, C, L]",
        |e, a| pool(e, a, PoolOp::Max, 1)
    ),
    b!(
        "avg_pool1d",
        ["x", "kernel", "stride?", "padding?"],
        "1-D average pooling of [N, C, L]",
        |e, a| pool(e, a, PoolOp::Avg, 1)
    ),
    b!(
        "max_pool2d",
        ["x", "kernel", "stride?", "padding?"],
        "2-D max pooling of [N, C, H, W]",
        |e, a| pool(e, a, PoolOp::Max, 2)
    ),
    b!(
        "avg_pool2d",
        ["x", "kernel", "stride?", "padding?"],
        "2-D average pooling of [N, C, H, W]",
        |e, a| pool(e, a, PoolOp::Avg, 2)
    ),
    b!(
        "upsample",
        ["x", "scale?"],
        "nearest-neighbour upsampling of [N, C, L] or [N, C, H, W]",
        upsample
    ),
    // padding and resampling
    b!(
        "pad",
        ["x", "widths", "mode?", "value?"],
        "pads the trailing axes by (before, after) pairs, last axis first (PyTorch's F.pad); \
         mode \"constant\" (with value), \"reflect\" or \"replicate\"",
        pad
    ),
    b!(
        "interpolate",
        ["x", "size?", "scale?", "mode?", "align_corners?"],
        "resamples [N, C, L] or [N, C, H, W] to a size or by a scale (PyTorch's F.interpolate); \
         mode \"nearest\", \"linear\" or \"bilinear\"",
        interpolate
    ),
    // attention
    b!(
        "attention",
        ["q", "k", "v", "causal?", "scale?", "mask?"],
        "scaled dot-product attention with grouped KV heads",
        attention
    ),
    b!("rope", ["x", "theta?", "offset?"], "rotary position embedding over [.., T, D]", rope),
    // losses
    b!(
        "softmax_cross_entropy",
        ["logits", "targets", "weight?", "ignore_index?"],
        "mean cross-entropy of logits [.., C] and integer targets [..], PyTorch's weighted \
         mean with per-class `weight` [C]; targets equal to `ignore_index` count for nothing",
        softmax_cross_entropy
    ),
    // comparisons and selection
    b!(
        "where",
        ["cond", "a", "b"],
        "`a` where the bool tensor `cond` holds, else `b` (broadcasting)",
        where_
    ),
    b!("maximum", ["a", "b"], "element-wise maximum (broadcasting; NaN wins)", |e, a| extremum(
        e,
        a,
        BinaryOp::Maximum
    )),
    b!("minimum", ["a", "b"], "element-wise minimum (broadcasting; NaN wins)", |e, a| extremum(
        e,
        a,
        BinaryOp::Minimum
    )),
    b!(
        "clamp",
        ["x", "min?", "max?"],
        "limits x to [min, max]; either bound may be left out",
        clamp
    ),
    // filled tensors and broadcasting
    b!(
        "full",
        ["shape", "value", "dtype?"],
        "a tensor of the given shape holding `value` everywhere (f32 by default)",
        full
    ),
    b!("zeros_like", ["x", "dtype?"], "zeros of x's shape (and dtype unless given)", |e, a| {
        like(e, a, 0.0)
    }),
    b!("ones_like", ["x", "dtype?"], "ones of x's shape (and dtype unless given)", |e, a| {
        like(e, a, 1.0)
    }),
    b!("broadcast_to", ["x", "shape"], "x repeated along axes to a shape (NumPy rules)", |e, a| {
        broadcast_to(e, a, false)
    }),
    b!(
        "expand",
        ["x", "shape"],
        "broadcast_to where -1 keeps the size of x's axis (PyTorch's expand)",
        |e, a| broadcast_to(e, a, true)
    ),
    b!(
        "one_hot",
        ["labels", "classes", "dtype?"],
        "labels as one-hot rows along a new last axis (f32 by default)",
        one_hot
    ),
    // scans and rankings along an axis
    b!(
        "cumsum",
        ["x", "axis", "reverse?"],
        "running sums along an axis (from its end when `reverse = true`)",
        cumsum
    ),
    b!(
        "topk",
        ["x", "k", "axis?"],
        "(values, i32 indices) of the k largest along an axis (the last by default)",
        topk
    ),
    b!(
        "take_along_axis",
        ["x", "index", "axis"],
        "x read along an axis at integer indices (torch.gather)",
        take_along_axis
    ),
    // fields
    b!(
        "tied",
        ["param"],
        "as a field's initializer, `name = tied(p)`: the parameter or buffer p itself under a \
         second checkpoint name, the field's (tied weights: GPT-2's lm_head.weight)",
        |e, a| e.tie(a.raw("param"), a.span)
    ),
    b!(
        "given",
        ["x?"],
        "whether an optional parameter was given (or a conditional field exists): false for \
         one left out, true for any value",
        given
    ),
    // compile-time values
    Builtin {
        name: TRAINING,
        params: &[],
        doc: "true while building a training plan (`--mode train`), false for an inference \
              plan: `if training { … } else { … }` elaborates one branch per plan",
        run: |e, _| Ok(Value::Bool(e.read_training())),
        value: Some("bool"),
    },
    // initializers
    b!("zeros", [], "initializer: all zeros", |_, _| Ok(Value::Init(InitSpec::Constant(0.0)))),
    b!("ones", [], "initializer: all ones", |_, _| Ok(Value::Init(InitSpec::Constant(1.0)))),
    b!("constant", ["value"], "initializer: every element `value`", |e, a| Ok(Value::Init(
        InitSpec::Constant(a.number(e, "value")?)
    ))),
    b!("normal", ["mean?", "std?"], "initializer: normal distribution (0, 1 by default)", normal),
    b!(
        "uniform",
        ["low?", "high?"],
        "initializer: uniform distribution (-1, 1 by default)",
        uniform
    ),
];

pub fn lookup(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

pub fn is_builtin(name: &str) -> bool {
    lookup(name).is_some()
}

pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|b| b.name)
}

pub fn all() -> &'static [Builtin] {
    BUILTINS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_names_are_unique_and_params_well_formed() {
        let mut names: Vec<&str> = names().collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
        for b in all() {
            let mut seen_optional = false;
            for p in b.params {
                assert!(
                    !seen_optional || p.ends_with('?'),
                    "{}: required parameter after an optional one",
                    b.name
                );
                seen_optional |= p.ends_with('?');
            }
        }
    }
}
