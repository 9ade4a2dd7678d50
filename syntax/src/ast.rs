//! The abstract syntax tree. Every node carries the byte span it was parsed from, which is how
//! diagnostics, the IR's source map and the language server point back at the model's own text.

use crate::span::Span;

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug, Default)]
pub struct File {
    pub items: Vec<Item>,
    /// Names of items that failed to parse (`fn f(` …), so later passes do not report every
    /// use of them as unknown.
    pub unparsed: Vec<Ident>,
}

#[derive(Clone, Debug)]
pub enum Item {
    Use(UseItem),
    Const(ConstItem),
    Fn(FnItem),
    Layer(LayerItem),
}

impl Item {
    pub fn name(&self) -> Option<&Ident> {
        match self {
            Item::Use(_) => None,
            Item::Const(c) => Some(&c.name),
            Item::Fn(f) => Some(&f.name),
            Item::Layer(l) => Some(&l.name),
        }
    }

    pub fn span(&self) -> Span {
        match self {
            Item::Use(u) => u.span,
            Item::Const(c) => c.span,
            Item::Fn(f) => f.span,
            Item::Layer(l) => l.span,
        }
    }
}

#[derive(Clone, Debug)]
pub struct UseItem {
    pub source: UseSource,
    /// `use m.{a, b as c}`; `None` imports the module itself (or the single item a dotted path
    /// ends in).
    pub names: Option<Vec<UseName>>,
    pub alias: Option<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum UseSource {
    /// `std.nn` or `std.loss.cross_entropy`.
    Path(Vec<Ident>),
    /// `"./blocks.mgn"`, relative to the importing file.
    File { path: String, span: Span },
}

#[derive(Clone, Debug)]
pub struct UseName {
    pub name: Ident,
    pub alias: Option<Ident>,
}

#[derive(Clone, Debug)]
pub struct ConstItem {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct FnItem {
    pub name: Ident,
    pub params: Vec<Param>,
    pub ret: Option<TypeExpr>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Layer,
    Model,
}

/// A `layer` or a `model` (a layer with inputs, outputs and a loss).
#[derive(Clone, Debug)]
pub struct LayerItem {
    pub kind: LayerKind,
    pub name: Ident,
    pub params: Vec<Param>,
    pub inputs: Vec<InputDecl>,
    pub fields: Vec<FieldDef>,
    pub forward: Vec<ForwardDef>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct InputDecl {
    pub name: Ident,
    pub ty: TensorType,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct FieldDef {
    pub name: Ident,
    pub init: FieldInit,
    /// `name = ... if cond`: the field exists only when `cond` holds.
    pub cond: Option<Expr>,
    pub span: Span,
}

/// What a tensor field is: trained, saved state, or a table every session recomputes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// `param`: trained, saved in checkpoints.
    Param,
    /// `buffer`: saved in and loaded from checkpoints, never trained.
    Buffer,
    /// `const`: computed from its `init` by every session; never trained, saved or loaded.
    Const,
    /// `state`: held by a session from one run to the next and written by `self.name = e`
    /// (a KV cache); starts at its `init`, never trained, saved or loaded.
    State,
}

impl TensorKind {
    pub fn keyword(self) -> &'static str {
        match self {
            TensorKind::Param => "param",
            TensorKind::Buffer => "buffer",
            TensorKind::Const => "const",
            TensorKind::State => "state",
        }
    }
}

#[derive(Clone, Debug)]
pub enum FieldInit {
    /// `param f32[..] init e`, `buffer f32[..] init e` or `const f32[..] init e`.
    Tensor { kind: TensorKind, ty: TensorType, init: Option<Expr> },
    /// `repeat(n, i) Layer(...)`, or `repeat(n, i, name = "block_{i}") Layer(...)`: `name` is
    /// the pattern of the copies' names (numbered `0`, `1`, … without one).
    Repeat { count: Expr, index: Option<Ident>, name: Option<Expr>, body: Expr },
    /// A sub-layer instantiation or any other expression.
    Expr(Expr),
}

#[derive(Clone, Debug)]
pub struct ForwardDef {
    pub params: Vec<Param>,
    pub ret: Option<TypeExpr>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Param {
    pub name: Ident,
    pub ty: TypeExpr,
    pub default: Option<Expr>,
    /// `name?: type`: a call may leave it out (then it has no default).
    pub optional: bool,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarType {
    Dim,
    Int,
    Float,
    Bool,
    Init,
    DType,
}

impl ScalarType {
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::Dim => "dim",
            ScalarType::Int => "int",
            ScalarType::Float => "float",
            ScalarType::Bool => "bool",
            ScalarType::Init => "init",
            ScalarType::DType => "dtype",
        }
    }
}

/// Element types as written in source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DTypeName {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U32,
    Bool,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
}

impl DTypeName {
    /// The name as written.
    pub fn name(self) -> &'static str {
        match self {
            DTypeName::F32 => "f32",
            DTypeName::F16 => "f16",
            DTypeName::BF16 => "bf16",
            DTypeName::I32 => "i32",
            DTypeName::I64 => "i64",
            DTypeName::U32 => "u32",
            DTypeName::Bool => "bool",
            DTypeName::Q8_0 => "q8_0",
            DTypeName::Q4_0 => "q4_0",
            DTypeName::Q4_1 => "q4_1",
            DTypeName::Q4K => "q4_k",
            DTypeName::Q6K => "q6_k",
        }
    }

    pub fn parse(s: &str) -> Option<DTypeName> {
        Some(match s {
            "f32" => DTypeName::F32,
            "f16" => DTypeName::F16,
            "bf16" => DTypeName::BF16,
            "i32" => DTypeName::I32,
            "i64" => DTypeName::I64,
            "u32" => DTypeName::U32,
            "bool" => DTypeName::Bool,
            "q8_0" => DTypeName::Q8_0,
            "q4_0" => DTypeName::Q4_0,
            "q4_1" => DTypeName::Q4_1,
            "q4_k" => DTypeName::Q4K,
            "q6_k" => DTypeName::Q6K,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug)]
pub enum TypeExpr {
    Scalar(ScalarType, Span),
    Tensor(TensorType),
    Tuple(Vec<TypeExpr>, Span),
}

impl TypeExpr {
    pub fn span(&self) -> Span {
        match self {
            TypeExpr::Scalar(_, s) | TypeExpr::Tuple(_, s) => *s,
            TypeExpr::Tensor(t) => t.span,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorType {
    pub dtype: ElemType,
    pub dims: Vec<DimItem>,
    pub span: Span,
}

/// A tensor type's element type.
#[derive(Clone, Debug)]
pub enum ElemType {
    /// Written out: `f32`, `q4_0`.
    Named(DTypeName),
    /// A name bound to a `dtype` value, as a parameter's type (`param weight_type[out, in]`):
    /// the grammar admits it only there. An `ExprKind::Name` expression, so that name
    /// resolution and evaluation treat it as any other use of the name.
    Value(Box<Expr>),
}

#[derive(Clone, Debug)]
pub enum DimItem {
    Expr(Expr),
    /// `..B`: any number of leading dims, bound as a group.
    Variadic(Ident),
}

#[derive(Clone, Debug)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub tail: Option<Box<Expr>>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum Stmt {
    Let {
        pat: Pattern,
        ty: Option<TypeExpr>,
        value: Expr,
        span: Span,
    },
    Output {
        name: Ident,
        value: Option<Expr>,
        span: Span,
    },
    Loss {
        value: Expr,
        span: Span,
    },
    /// `self.field = value`: the field's value from the next run on.
    Assign {
        field: Ident,
        value: Expr,
        span: Span,
    },
}

#[derive(Clone, Debug)]
pub enum Pattern {
    Name(Ident),
    Wildcard(Span),
    Tuple(Vec<Pattern>, Span),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    MatMul,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::MatMul => "@",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }

    /// Binding strength: 1 `||`, 2 `&&`, 3 comparisons, 4 `+ -`, 5 `* / % @`.
    pub fn level(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::MatMul => 5,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    DType(DTypeName),
    Name(String),
    SelfRef,
    Unary(UnOp, Box<Expr>),
    /// Binary operators of one precedence level in a row, applied left to right: `a + b - c`
    /// is `Binary(a, [(Add, b), (Sub, c)])`. A flat run of any length is one node (the tree
    /// does not deepen with it); `rest` is never empty, and every operator in it has the same
    /// `BinOp::level`. Parentheses keep their own node: `(a + b) + c` has `a + b` as `first`.
    Binary(Box<Expr>, Vec<(BinOp, Expr)>),
    Call {
        callee: Box<Expr>,
        args: Vec<Arg>,
    },
    /// `e.name` or `e.0` (tuple position, stored as its digits).
    Field(Box<Expr>, Ident),
    Index(Box<Expr>, Box<Expr>),
    /// `e^T`: swap the last two axes.
    Transpose(Box<Expr>),
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    /// `if c1 { .. } else if c2 { .. } else { .. }`, flattened so long chains need no recursion.
    If {
        branches: Vec<(Expr, Block)>,
        otherwise: Option<Block>,
    },
    /// Produced where the parser already reported an error (e.g. too deep), so later passes
    /// skip it.
    Error,
}
