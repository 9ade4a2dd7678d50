//! Packed (quantized) parameters: `weight = param q4_0[out, in]`, or a layer's `dtype`
//! argument as the type (`param weight_type[out, in]`). Only parameters may be packed; reading
//! one gives its f32 values through an `Op::Dequantize` placed right after its `Param` node, so
//! every builtin meets an ordinary f32 tensor. A packed parameter is never trained: its values
//! are a function of a few bits, so a training plan trains the parameters around it.

use super::*;

impl<'p> Evaluator<'p> {
    /// The element type a tensor type names: written out, or the value of a `dtype` name.
    pub(super) fn elem_type(&mut self, t: &TensorType) -> R<DType> {
        match &t.dtype {
            ElemType::Named(d) => Ok(dtype_of(*d)),
            ElemType::Value(e) => match self.eval(e)? {
                Value::DType(d) => Ok(d),
                v => Err(Diagnostic::error(
                    "E0201",
                    format!(
                        "a parameter's element type must be a dtype, found {}",
                        self.describe(&v)
                    ),
                    e.span,
                    "not a dtype",
                )
                .with_help("declare the argument as `name: dtype` (`weight_type: dtype = f32`)")),
            },
        }
    }

    /// Refuses a packed type on a tensor that is not a parameter, and a parameter of a shape
    /// the type cannot store.
    pub(crate) fn check_packed(
        &self,
        (dtype, shape): (DType, &[usize]),
        kind: Option<TensorKind>,
        span: Span,
        what: &str,
    ) -> R<()> {
        if !dtype.is_packed() {
            return Ok(());
        }
        if kind != Some(TensorKind::Param) {
            return Err(not_packed(dtype, span, what));
        }
        dtype.packs(shape).map_err(|why| {
            let code = if shape.is_empty() { "E0206" } else { "E0203" };
            Diagnostic::error(
                code,
                format!("{what} cannot be {dtype}: {why}"),
                span,
                "declared here",
            )
            .with_help("a packed parameter's last axis is a whole number of its blocks")
        })
    }

    /// A packed parameter's values as f32: the `Dequantize` after its `Param` node.
    pub(super) fn dequantized(&mut self, param: NodeId, span: Span) -> R<NodeId> {
        let shape = self.graph.node(param).shape.clone();
        self.add(Op::Dequantize, vec![param], DType::F32, shape, span)
    }

    /// The parameter a tensor value is, looking through the `Dequantize` that reading a packed
    /// parameter gives.
    pub fn param_of(&self, id: NodeId) -> Option<usize> {
        let n = self.graph.node(id);
        match n.op {
            Op::Param { index } => Some(index),
            Op::Dequantize => match self.graph.node(n.inputs[0]).op {
                Op::Param { index } => Some(index),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The error for a packed type where only a parameter may have one.
pub fn not_packed(dtype: DType, span: Span, what: &str) -> Diagnostic {
    Diagnostic::error(
        "E0202",
        format!("{what} cannot be {dtype}: only a parameter can have a packed type"),
        span,
        format!("{dtype} is packed"),
    )
    .with_help(
        "a packed type (q8_0, q4_0, q4_1, q4_k, q6_k) stores a parameter's weights in blocks; \
         a model reads them as f32, and computes in f32, f16 or bf16",
    )
}
