//! The op vocabulary shared by the compiler (which builds graphs of these) and the runtime
//! (which executes them). An op is here when its derivative is local and it lowers to one kernel
//! archetype; the derivative ops at the end are what autodiff emits.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnaryOp {
    Neg,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Sin,
    Cos,
    Square,
    /// The error function (exact, not an approximation).
    Erf,
    /// `log(1 + x)`, accurate for small `x`.
    Log1p,
    /// `exp(x) − 1`, accurate for small `x`.
    Expm1,
    /// `log(1 + exp(x))`, computed without overflow (`softplus` with β = 1 and no threshold;
    /// the builtin adds both).
    Softplus,
}

impl UnaryOp {
    /// Every point-wise function, for tests that cover them all.
    pub const ALL: [UnaryOp; 19] = [
        UnaryOp::Neg,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Abs,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Square,
        UnaryOp::Erf,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Softplus,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Element-wise maximum and minimum (PyTorch's `maximum` / `minimum`): a NaN on either
    /// side gives NaN.
    Maximum,
    Minimum,
}

/// The element-wise comparisons: `[a, b]` → a `bool` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub const ALL: [CompareOp; 6] =
        [CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge];

    /// The operator as written: `==`, `<`, …
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
        }
    }

    /// `a op b` (false when either side is NaN, except `!=`, as IEEE comparisons are).
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolOp {
    Max,
    Avg,
}

/// What `pad` puts around an axis: a constant, the mirror image without the edge element, or
/// the edge element repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PadMode {
    Constant,
    Reflect,
    Replicate,
}

/// How `interpolate` reads: the nearest element, or the two (per axis) around the source
/// position weighted linearly (linear in 1-D, bilinear in 2-D).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InterpMode {
    Nearest,
    Linear,
}

/// The op vocabulary. An op is here when its derivative is local and it lowers to one kernel
/// archetype; anything expressible from these (split, embedding, mse) is built from them.
/// Optional operands (norm weights, conv bias, attention mask) follow the required ones in
/// `Node::inputs`, in the order of their `has_*` flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    Input {
        name: String,
    },
    Param {
        index: usize,
    },
    /// A scalar constant (shape `[]`), broadcast by its consumers.
    Constant {
        value: f64,
    },
    /// `0 … n-1` along the only axis.
    Arange,
    Unary(UnaryOp),
    Pow {
        exponent: f64,
    },
    /// Elementwise with NumPy broadcasting.
    Binary(BinaryOp),
    Cast,
    /// A packed parameter's values (`DType::Q8_0` … `Q6_K`) as f32, of the same shape: the only
    /// step that reads a packed value. Backends read through it in place where they can (a
    /// product decoding its weight's blocks as it stages them, a lookup decoding the rows it
    /// gathers), so it names what is computed, not a copy.
    Dequantize,
    /// The identity, through which autodiff sends no gradient: targets, teacher networks,
    /// straight-through estimators.
    StopGradient,
    /// Batched matrix product with broadcasting over leading axes (PyTorch `matmul` rules).
    MatMul,
    Permute {
        perm: Vec<usize>,
    },
    Reshape,
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `[x, start]` → `len` elements of `axis` from `start`, an `i32[]` read at run time and
    /// clamped so the window stays inside the axis (`torch.narrow` with a tensor start).
    Narrow {
        axis: usize,
        len: usize,
    },
    /// `[x, src, start]` → `x` with `src` written over `start .. start + len` of `axis` (`len`
    /// is `src`'s size there; elsewhere the shapes are equal). `start` is an `i32[]` read at run
    /// time and clamped like `Narrow`'s: XLA's dynamic_update_slice, the write into a KV cache.
    SliceScatter {
        axis: usize,
    },
    /// `index_select`: the axis is replaced by the index tensor's shape.
    Gather {
        axis: usize,
    },
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    ArgMax {
        axis: usize,
    },
    Softmax {
        axis: usize,
        log: bool,
    },
    LayerNorm {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    RmsNorm {
        eps: f64,
        has_weight: bool,
    },
    GroupNorm {
        groups: usize,
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs: x, running_mean, running_var, then weight and bias if present. Batch statistics
    /// in training plans (updating the running ones), running statistics in inference plans.
    BatchNorm {
        eps: f64,
        momentum: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// Identity in inference plans.
    Dropout {
        p: f64,
    },
    Conv {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
        has_bias: bool,
    },
    Pool {
        op: PoolOp,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        padding: Vec<usize>,
    },
    /// Nearest-neighbour upsampling of the spatial axes (all after the first two).
    Upsample {
        scale: usize,
    },
    Attention {
        causal: bool,
        scale: f64,
        has_mask: bool,
    },
    /// `inverse` rotates by the negative angle: the derivative of the forward rotation.
    /// `[x]`, or `[x, start]` with an `i32[]` added to `offset` at run time (decoding).
    Rope {
        theta: f64,
        offset: usize,
        inverse: bool,
    },
    /// Mean cross-entropy of logits `[.., C]` against integer targets `[..]`.
    SoftmaxCrossEntropy,
    // Padding and resampling (`shape::resample` says where each element reads from).
    /// Pads axis `a` by `widths[a]` (before, after): with `value`, the mirror image or the edge.
    Pad {
        widths: Vec<[usize; 2]>,
        mode: PadMode,
        value: f64,
    },
    /// Resamples the spatial axes of `[N, C, L]` or `[N, C, H, W]` to `size` with PyTorch's
    /// index math; `scale` is the user's factor per axis when one was given (it sets the ratio).
    Interpolate {
        mode: InterpMode,
        size: Vec<usize>,
        scale: Option<Vec<f64>>,
        align_corners: bool,
    },

    // ---- comparisons and selection ----
    /// `[a, b]` → `bool`, element-wise with NumPy broadcasting; operands of one dtype.
    Compare(CompareOp),
    /// `[cond, a, b]` → `a` where `cond` (a `bool` tensor) holds, else `b`; the three broadcast
    /// together (NumPy rules).
    Where,
    /// Running sum along `axis`, from its end when `reverse`.
    Cumsum {
        axis: usize,
        reverse: bool,
    },
    /// `[x]` → the `i32` positions along `axis` of its `k` largest elements, largest first; ties
    /// go to the lower position and NaN counts as the largest (PyTorch's `topk` indices).
    TopK {
        k: usize,
        axis: usize,
    },
    /// `[x, index]` → `x` read along `axis` at `index` (`torch.gather`,
    /// `numpy.take_along_axis`): `index` has `x`'s rank and, but on `axis`, its sizes.
    TakeAlong {
        axis: usize,
    },

    // ---- derivative ops (made by autodiff; each is the local rule of one forward op) ----
    /// Sums `[dy]` over the axes that broadcasting added or stretched, down to this node's shape.
    SumTo,
    /// Broadcasts `[x]` to this node's shape (NumPy rules).
    BroadcastTo,
    /// `[x, dy]` → dx of a pointwise op.
    UnaryGrad(UnaryOp),
    /// `[x, y, dy]` → dx of `Reduce`: spread for sum/mean, routed to the first extreme for max/min.
    ReduceGrad {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// `[y, dy]` → dx, where `y` is the forward output.
    SoftmaxGrad {
        axis: usize,
        log: bool,
    },
    /// `[dy]` → dx: `dy` placed at `start..end` of `axis`, zeros elsewhere.
    SliceGrad {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `[index, dy]` → dx: `dy` scatter-added along `axis` at `index`.
    GatherGrad {
        axis: usize,
    },
    /// The forward op's inputs then `dy` → the gradient of input `part` (0 = x, 1 = weight,
    /// 2 = bias).
    LayerNormGrad {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
    },
    RmsNormGrad {
        eps: f64,
        has_weight: bool,
        part: GradPart,
    },
    GroupNormGrad {
        groups: usize,
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
    },
    /// Inputs as the forward op, then `dy`. Batch statistics in training plans.
    BatchNormGrad {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
        training: bool,
    },
    /// `[dy]` → dx with the forward op's mask (same seed, same node).
    DropoutGrad {
        p: f64,
        forward: u32,
    },
    /// `[dy, weight]` → dx.
    ConvGradInput {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
    },
    /// `[x, dy]` → dweight.
    ConvGradWeight {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
    },
    /// `[x, dy]` → dx: max pooling routes to the (first) arg-max, average pooling spreads.
    PoolGrad {
        op: PoolOp,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        padding: Vec<usize>,
    },
    /// `[dy]` → dx: sums each `scale`-sized block.
    UpsampleGrad {
        scale: usize,
    },
    /// `[q, k, v, mask?, dy]` → the gradient of q (part `Q`), k (`K`), v (`V`) or the mask
    /// (`Mask`: `dS`, the derivative of the scores, in the scores' full shape
    /// `[..B, Hq, Tq, Tk]`; autodiff sums it down to the mask's own shape).
    AttentionGrad {
        causal: bool,
        scale: f64,
        has_mask: bool,
        part: GradPart,
    },
    /// `[logits, targets, dloss]` → dlogits = (softmax − one_hot) · dloss / N.
    SoftmaxCrossEntropyGrad,
    /// `[dy]` → dx: each element of `dy` added to the element of `x` it was read from.
    PadGrad {
        widths: Vec<[usize; 2]>,
        mode: PadMode,
    },
    /// `[dy]` → dx of the step's shape: each element of `dy` spread over the elements it read,
    /// by their weights (the forward op's attributes).
    InterpolateGrad {
        mode: InterpMode,
        size: Vec<usize>,
        scale: Option<Vec<f64>>,
        align_corners: bool,
    },
    /// `[index, dy]` → dx of `TakeAlong`: `dy` added into zeros at `index` along `axis`.
    TakeAlongGrad {
        axis: usize,
    },
}

/// Which input of a multi-input op a derivative op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GradPart {
    Input,
    Weight,
    Bias,
    Q,
    K,
    V,
    /// Attention's additive mask (a learned bias: relative positions, ALiBi slopes).
    Mask,
}

/// `[1, 2, 3]`.
fn list(v: &[usize]) -> String {
    format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

impl Op {
    /// The contractions: matrix products, convolutions and their derivatives, attention and
    /// its derivative. Each sums many products and accumulates in f32 whatever its operands'
    /// type; the mixed precision policy rounds their operands, and only theirs, to the half
    /// type, and keeps their f32 results (`infer::check` lets any step keep the f32 value of a
    /// result that would be half).
    pub fn is_contraction(&self) -> bool {
        matches!(
            self,
            Op::MatMul
                | Op::Conv { .. }
                | Op::ConvGradInput { .. }
                | Op::ConvGradWeight { .. }
                | Op::Attention { .. }
                | Op::AttentionGrad { .. }
        )
    }

    /// The name of an op without attributes that `describe` prints as it is.
    fn plain_name(&self) -> &'static str {
        match self {
            Op::Cast => "cast",
            Op::Dequantize => "dequantize",
            Op::StopGradient => "stop_gradient",
            _ => "matmul",
        }
    }

    /// Short name plus attributes, as printed in IR dumps.
    pub fn describe(&self) -> String {
        match self {
            Op::Input { name } => format!("input {name}"),
            Op::Param { .. } => "param".into(),
            Op::Constant { value } => format!("constant {}", fmt_f64(*value)),
            Op::Arange => "arange".into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Pow { exponent } => format!("pow {}", fmt_f64(*exponent)),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Cast | Op::Dequantize | Op::StopGradient | Op::MatMul => self.plain_name().into(),
            Op::Permute { perm } => format!("permute {}", list(perm)),
            Op::Reshape => "reshape".into(),
            Op::Concat { axis } => format!("concat axis={axis}"),
            Op::Slice { axis, start, end } => format!("slice axis={axis} {start}..{end}"),
            Op::Narrow { .. } | Op::SliceScatter { .. } => self.describe_selection(),
            Op::Gather { axis } => format!("gather axis={axis}"),
            Op::Reduce { op, axes, keepdim } => {
                format!(
                    "{} axes={}{}",
                    format!("{op:?}").to_lowercase(),
                    list(axes),
                    if *keepdim { " keepdim" } else { "" }
                )
            }
            Op::ArgMax { axis } => format!("argmax axis={axis}"),
            Op::Softmax { axis, log } => {
                format!("{} axis={axis}", if *log { "log_softmax" } else { "softmax" })
            }
            Op::LayerNorm { eps, .. } => format!("layer_norm eps={}", fmt_f64(*eps)),
            Op::RmsNorm { eps, .. } => format!("rms_norm eps={}", fmt_f64(*eps)),
            Op::GroupNorm { groups, eps, .. } => {
                format!("group_norm groups={groups} eps={}", fmt_f64(*eps))
            }
            Op::BatchNorm { eps, momentum, .. } => {
                format!("batch_norm eps={} momentum={}", fmt_f64(*eps), fmt_f64(*momentum))
            }
            Op::Dropout { p } => format!("dropout p={}", fmt_f64(*p)),
            Op::Conv { stride, padding, dilation, groups, .. } => {
                format!(
                    "conv{}d stride={} padding={} dilation={} groups={groups}",
                    stride.len(),
                    list(stride),
                    list(padding),
                    list(dilation)
                )
            }
            Op::Pool { op, kernel, stride, padding } => format!(
                "{}_pool{}d kernel={} stride={} padding={}",
                if *op == PoolOp::Max { "max" } else { "avg" },
                kernel.len(),
                list(kernel),
                list(stride),
                list(padding)
            ),
            Op::Upsample { scale } => format!("upsample scale={scale}"),
            Op::Attention { causal, scale, .. } => format!(
                "attention{} scale={}",
                if *causal { " causal" } else { "" },
                fmt_f64(*scale)
            ),
            Op::Rope { theta, offset, inverse } => format!(
                "rope{} theta={} offset={offset}",
                if *inverse { "_inverse" } else { "" },
                fmt_f64(*theta)
            ),
            Op::SoftmaxCrossEntropy => "softmax_cross_entropy".into(),
            Op::Pad { .. } | Op::Interpolate { .. } | Op::PadGrad { .. } => self.describe_spatial(),
            Op::InterpolateGrad { .. } => self.describe_spatial(),
            Op::Compare(_) | Op::Where | Op::Cumsum { .. } | Op::TopK { .. } => {
                self.describe_selection()
            }
            Op::TakeAlong { .. } | Op::TakeAlongGrad { .. } => self.describe_selection(),
            Op::SumTo => "sum_to".into(),
            Op::BroadcastTo => "broadcast_to".into(),
            Op::UnaryGrad(u) => format!("{}_grad", format!("{u:?}").to_lowercase()),
            Op::ReduceGrad { op, axes, .. } => {
                format!("{}_grad axes={}", format!("{op:?}").to_lowercase(), list(axes))
            }
            Op::SoftmaxGrad { axis, log } => {
                format!("{}_grad axis={axis}", if *log { "log_softmax" } else { "softmax" })
            }
            Op::SliceGrad { axis, start, end } => format!("slice_grad axis={axis} {start}..{end}"),
            Op::GatherGrad { axis } => format!("gather_grad axis={axis}"),
            Op::LayerNormGrad { part, .. } => format!("layer_norm_grad {part:?}").to_lowercase(),
            Op::RmsNormGrad { part, .. } => format!("rms_norm_grad {part:?}").to_lowercase(),
            Op::GroupNormGrad { part, .. } => format!("group_norm_grad {part:?}").to_lowercase(),
            Op::BatchNormGrad { part, .. } => format!("batch_norm_grad {part:?}").to_lowercase(),
            Op::DropoutGrad { forward, .. } => format!("dropout_grad of %{forward}"),
            Op::ConvGradInput { stride, .. } => format!("conv{}d_grad_input", stride.len()),
            Op::ConvGradWeight { stride, .. } => format!("conv{}d_grad_weight", stride.len()),
            Op::PoolGrad { op, .. } => {
                format!("{}_pool_grad", if *op == PoolOp::Max { "max" } else { "avg" })
            }
            Op::UpsampleGrad { scale } => format!("upsample_grad scale={scale}"),
            Op::AttentionGrad { part, .. } => format!("attention_grad {part:?}").to_lowercase(),
            Op::SoftmaxCrossEntropyGrad => "softmax_cross_entropy_grad".into(),
        }
    }
}

impl Op {
    /// `describe` of padding and resampling and their derivatives.
    fn describe_spatial(&self) -> String {
        let lower = |m: &dyn std::fmt::Debug| format!("{m:?}").to_lowercase();
        match self {
            Op::Pad { widths, mode, value } => {
                let w: Vec<String> = widths.iter().map(|[b, e]| format!("({b}, {e})")).collect();
                format!("pad {} [{}] value={}", lower(mode), w.join(", "), fmt_f64(*value))
            }
            Op::Interpolate { mode, size, align_corners, .. } => format!(
                "interpolate {} size={size:?}{}",
                lower(mode),
                if *align_corners { " align_corners" } else { "" }
            ),
            Op::PadGrad { mode, .. } => format!("pad_grad {}", lower(mode)),
            Op::InterpolateGrad { mode, .. } => format!("interpolate_grad {}", lower(mode)),
            _ => unreachable!("`describe` sends padding and resampling here"),
        }
    }
}

impl Op {
    /// [`Op::describe`] of the comparisons, selections and scans.
    fn describe_selection(&self) -> String {
        match self {
            Op::Compare(c) => format!("compare {}", c.symbol()),
            Op::Where => "where".into(),
            Op::Cumsum { axis, reverse } => {
                format!("cumsum axis={axis}{}", if *reverse { " reverse" } else { "" })
            }
            Op::TopK { k, axis } => format!("topk k={k} axis={axis}"),
            Op::TakeAlong { axis } => format!("take_along axis={axis}"),
            Op::TakeAlongGrad { axis } => format!("take_along_grad axis={axis}"),
            Op::Narrow { axis, len } => format!("narrow axis={axis} len={len}"),
            Op::SliceScatter { axis } => format!("slice_scatter axis={axis}"),
            _ => unreachable!("`describe` sends comparisons, selections and scans here"),
        }
    }
}

/// Prints a float compactly and exactly enough to read back (`0.02`, `1e-5`, `10000`).
pub fn fmt_f64(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e6) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}
