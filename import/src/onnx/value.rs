//! Values while a graph is translated: a constant known at import time (initializers,
//! `Constant` nodes and everything computed from them and from static shapes), or a tensor the
//! generated model computes at run time, with its element type and shape.
//!
//! Sizes are [`Sym`]s: the size the export was made at, and, when it follows a dynamic axis of
//! an input, the `.mgn` expression of it in the model's `dim` arguments (`batch * 12`), so that
//! shape arithmetic folded here still follows the arguments in the generated source.

use std::fmt;

/// An element type: those mgn has, and a few ONNX ones constants may hold while they fold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dt {
    F32,
    F16,
    Bf16,
    F64,
    I32,
    I64,
    I8,
    U8,
    Bool,
}

impl Dt {
    pub fn from_onnx(code: i32) -> Option<Dt> {
        Some(match code {
            1 => Dt::F32,
            2 => Dt::U8,
            3 => Dt::I8,
            6 => Dt::I32,
            7 => Dt::I64,
            9 => Dt::Bool,
            10 => Dt::F16,
            11 => Dt::F64,
            16 => Dt::Bf16,
            _ => return None,
        })
    }

    /// The `.mgn` spelling, for types a run-time tensor may have.
    pub fn mgn(self) -> Option<&'static str> {
        Some(match self {
            Dt::F32 => "f32",
            Dt::F16 => "f16",
            Dt::Bf16 => "bf16",
            Dt::I32 => "i32",
            Dt::I64 => "i64",
            Dt::Bool => "bool",
            Dt::F64 | Dt::I8 | Dt::U8 => return None,
        })
    }

    pub fn onnx_name(self) -> &'static str {
        match self {
            Dt::F32 => "float",
            Dt::F16 => "float16",
            Dt::Bf16 => "bfloat16",
            Dt::F64 => "double",
            Dt::I32 => "int32",
            Dt::I64 => "int64",
            Dt::I8 => "int8",
            Dt::U8 => "uint8",
            Dt::Bool => "bool",
        }
    }

    pub fn width(self) -> usize {
        match self {
            Dt::F64 | Dt::I64 => 8,
            Dt::F32 | Dt::I32 => 4,
            Dt::F16 | Dt::Bf16 => 2,
            Dt::I8 | Dt::U8 | Dt::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dt::F32 | Dt::F16 | Dt::Bf16 | Dt::F64)
    }
}

/// An integer known at import time: its value in the export, and the `.mgn` expression that
/// computes it from the model's arguments when it depends on them.
#[derive(Clone, Debug, PartialEq)]
pub struct Sym {
    pub v: i64,
    pub e: Option<String>,
}

impl Sym {
    pub fn lit(v: i64) -> Sym {
        Sym { v, e: None }
    }

    pub fn named(v: i64, name: &str) -> Sym {
        Sym { v, e: Some(name.to_string()) }
    }

    /// `self op other`, folding the value and, if either side is symbolic, the expression.
    pub fn op(&self, other: &Sym, op: char) -> Option<Sym> {
        let v = match op {
            '+' => self.v.checked_add(other.v)?,
            '-' => self.v.checked_sub(other.v)?,
            '*' => self.v.checked_mul(other.v)?,
            '/' => {
                if other.v == 0 {
                    return None;
                }
                self.v.div_euclid(other.v)
            }
            '%' => {
                if other.v == 0 {
                    return None;
                }
                self.v.rem_euclid(other.v)
            }
            _ => return None,
        };
        let e = match (&self.e, &other.e) {
            (None, None) => None,
            _ if op == '/' => Some(format!("floor_div({}, {})", self.text(), other.text())),
            _ => Some(format!("({} {op} {})", self.text(), other.text())),
        };
        Some(Sym { v, e })
    }

    /// The `.mgn` text: the expression, or the number.
    pub fn text(&self) -> String {
        match &self.e {
            Some(e) => e.clone(),
            None if self.v < 0 => format!("({})", self.v),
            None => self.v.to_string(),
        }
    }

    pub fn is_static(&self) -> bool {
        self.e.is_none()
    }
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// The elements of a constant: floats (every float type, as f32, the precision mgn computes
/// in), integers (every integer type) or bools.
#[derive(Clone, Debug, PartialEq)]
pub enum Elems {
    F(Vec<f32>),
    I(Vec<Sym>),
    B(Vec<bool>),
}

impl Elems {
    pub fn ints(it: impl Iterator<Item = i64>) -> Elems {
        Elems::I(it.map(Sym::lit).collect())
    }

    pub fn len(&self) -> usize {
        match self {
            Elems::F(v) => v.len(),
            Elems::I(v) => v.len(),
            Elems::B(v) => v.len(),
        }
    }

    #[allow(dead_code)] // beside `len`, as clippy asks
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor known at import time.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub dt: Dt,
    pub shape: Vec<usize>,
    pub elems: Elems,
}

impl Const {
    pub fn ints(&self) -> Option<&[Sym]> {
        match &self.elems {
            Elems::I(v) => Some(v),
            _ => None,
        }
    }

    /// Integer elements that are plain numbers (none follows a dynamic size).
    pub fn static_ints(&self) -> Option<Vec<i64>> {
        self.ints()?.iter().map(|s| s.is_static().then_some(s.v)).collect()
    }

    pub fn floats(&self) -> Option<&[f32]> {
        match &self.elems {
            Elems::F(v) => Some(v),
            _ => None,
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn shape_syms(&self) -> Vec<Sym> {
        self.shape.iter().map(|&d| Sym::lit(d as i64)).collect()
    }

    /// The one element of a scalar (or one-element) constant, as `.mgn` literal text.
    pub fn scalar_text(&self) -> Option<String> {
        if self.numel() != 1 {
            return None;
        }
        Some(match &self.elems {
            Elems::F(v) => float_text(v[0])?,
            Elems::I(v) => v[0].text(),
            Elems::B(v) => v[0].to_string(),
        })
    }
}

/// A float as `.mgn` source that reads back as the same f32: the shortest round-trip digits,
/// always with a `.` or an exponent so it is a float literal. Infinities and NaN have none.
pub fn float_text(v: f32) -> Option<String> {
    if v.is_nan() {
        return None;
    }
    // An infinite constant (a mask's -inf) is the largest finite f32 of its sign: a run
    // checking its numerics refuses infinities, and the masked scores still vanish in a
    // softmax (a row masked everywhere gives a uniform row where ONNX gives NaN). The header
    // of the generated source says so when it happens.
    let v = if v.is_infinite() { f32::MAX.copysign(v) } else { v };
    let s = format!("{:?}", v.abs());
    let s = if s.contains(['.', 'e', 'E']) { s } else { format!("{s}.0") };
    // `1e-5` needs digits on both sides of a `.`; `{:?}` writes `1e-5`, which the grammar takes.
    Some(if v.is_sign_negative() && v != 0.0 { format!("(-{s})") } else { s })
}

/// A value of the graph being translated.
#[derive(Clone, Debug)]
pub enum Val {
    Const(Const),
    Run(Run),
}

/// A tensor the generated model computes: the `.mgn` expression that names it (a `let`, an
/// input, a field), its element type and shape.
#[derive(Clone, Debug)]
pub struct Run {
    pub expr: String,
    pub dt: Dt,
    pub shape: Vec<Sym>,
}

impl Run {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The type as `.mgn` writes it, `f32[batch, 3, 224, 224]`.
    pub fn ty(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(Sym::text).collect();
        format!("{}[{}]", self.dt.mgn().unwrap_or("?"), dims.join(", "))
    }
}
