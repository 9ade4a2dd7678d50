//! The point-wise functions of the op vocabulary and their derivatives, defined once, as
//! PyTorch defines them: the CPU backend evaluates them element by element (in `f32` or `f64`),
//! the compiler folds constants with them (`f64`), and the GPU's WGSL expressions are tested
//! against the CPU backend, which calls these.

use crate::op::{BinaryOp, UnaryOp};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// `f32` or `f64`: what the functions below are written over.
pub trait Real:
    Copy
    + PartialOrd
    + Neg<Output = Self>
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    fn of(x: f64) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, p: Self) -> Self;
    fn erf(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! real {
    ($t:ty, $erf:path) => {
        impl Real for $t {
            fn of(x: f64) -> $t {
                x as $t
            }
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> $t {
                <$t>::tanh(self)
            }
            fn sin(self) -> $t {
                <$t>::sin(self)
            }
            fn cos(self) -> $t {
                <$t>::cos(self)
            }
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
            fn powf(self, p: $t) -> $t {
                <$t>::powf(self, p)
            }
            fn erf(self) -> $t {
                $erf(self)
            }
            fn ln_1p(self) -> $t {
                <$t>::ln_1p(self)
            }
            fn exp_m1(self) -> $t {
                <$t>::exp_m1(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

real!(f32, libm::erff);
real!(f64, libm::erf);

/// The cubic coefficient of GELU's tanh approximation.
pub const GELU_TANH_C: f64 = 0.044715;

fn sigmoid<T: Real>(x: T) -> T {
    T::of(1.0) / (T::of(1.0) + (-x).exp())
}

/// `f(x)` of a point-wise op. `relu` keeps a NaN, as PyTorch does.
pub fn unary<T: Real>(op: UnaryOp, x: T) -> T {
    let (zero, one, half) = (T::of(0.0), T::of(1.0), T::of(0.5));
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Relu => {
            if x > zero || x.is_nan() {
                x
            } else {
                zero
            }
        }
        UnaryOp::Gelu => half * x * (one + (x * T::of(std::f64::consts::FRAC_1_SQRT_2)).erf()),
        UnaryOp::GeluTanh => {
            let k = (T::of(2.0) / T::of(std::f64::consts::PI)).sqrt();
            let u = k * (x + T::of(GELU_TANH_C) * x * x * x);
            half * x * (one + u.tanh())
        }
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => one / x.sqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Square => x * x,
        UnaryOp::Erf => x.erf(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        // max(x, 0) + log(1 + e^−|x|): the exponential never overflows, and the log1p keeps
        // the tail (e^−|x| below f32's epsilon) instead of rounding 1 + e^−|x| to 1.
        UnaryOp::Softplus => {
            let m = if x > zero { x } else { zero };
            m + (-x.abs()).exp().ln_1p()
        }
    }
}

/// `a op b` of a binary op on floats. `maximum` and `minimum` give NaN when either side is NaN,
/// as PyTorch's do (IEEE `max` would return the other side).
pub fn binary<T: Real>(op: BinaryOp, a: T, b: T) -> T {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum | BinaryOp::Minimum if a.is_nan() || b.is_nan() => a + b,
        BinaryOp::Maximum => {
            if a >= b {
                a
            } else {
                b
            }
        }
        BinaryOp::Minimum => {
            if a <= b {
                a
            } else {
                b
            }
        }
    }
}

/// `f'(x)`, with PyTorch's choice at the kinks: relu'(0) = 0, |x|'(0) = 0.
pub fn derivative<T: Real>(op: UnaryOp, x: T) -> T {
    let (zero, one, half) = (T::of(0.0), T::of(1.0), T::of(0.5));
    let pi = T::of(std::f64::consts::PI);
    match op {
        UnaryOp::Neg => -one,
        UnaryOp::Relu => {
            if x > zero {
                one
            } else {
                zero
            }
        }
        UnaryOp::Gelu => {
            let cdf = half * (one + (x * T::of(std::f64::consts::FRAC_1_SQRT_2)).erf());
            let pdf = (-half * x * x).exp() / (T::of(2.0) * pi).sqrt();
            cdf + x * pdf
        }
        UnaryOp::GeluTanh => {
            let k = (T::of(2.0) / pi).sqrt();
            let c = T::of(GELU_TANH_C);
            let t = (k * (x + c * x * x * x)).tanh();
            half * (one + t) + half * x * (one - t * t) * k * (one + T::of(3.0) * c * x * x)
        }
        UnaryOp::Silu => {
            let s = sigmoid(x);
            s * (one + x * (one - s))
        }
        UnaryOp::Sigmoid => {
            let s = sigmoid(x);
            s * (one - s)
        }
        UnaryOp::Tanh => {
            let t = x.tanh();
            one - t * t
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => one / x,
        UnaryOp::Sqrt => half / x.sqrt(),
        UnaryOp::Rsqrt => -half * x.powf(T::of(-1.5)),
        UnaryOp::Abs => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero
            }
        }
        UnaryOp::Sin => x.cos(),
        UnaryOp::Cos => -x.sin(),
        UnaryOp::Square => T::of(2.0) * x,
        UnaryOp::Erf => T::of(std::f64::consts::FRAC_2_SQRT_PI) * (-x * x).exp(),
        UnaryOp::Log1p => one / (one + x),
        UnaryOp::Expm1 => x.exp(),
        UnaryOp::Softplus => sigmoid(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_match_finite_differences() {
        for op in UnaryOp::ALL {
            for x in [0.3, 1.7, 2.5] {
                let h = 1e-6;
                let fd = (unary(op, x + h) - unary(op, x - h)) / (2.0 * h);
                let d = derivative(op, x);
                assert!((fd - d).abs() < 1e-6 * (1.0 + d.abs()), "{op:?} at {x}: {d} vs {fd}");
            }
        }
    }

    #[test]
    fn erf_is_accurate() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (-1.0, -0.8427007929497149),
        ] {
            assert!((Real::erf(x) - want).abs() < 1e-12, "erf({x}) (want {want})");
        }
    }

    #[test]
    fn known_values_and_kinks() {
        assert!(unary(UnaryOp::Relu, f64::NAN).is_nan());
        assert_eq!(derivative(UnaryOp::Relu, 0.0f32), 0.0);
        assert_eq!(derivative(UnaryOp::Abs, 0.0f64), 0.0);
        assert!((unary(UnaryOp::Gelu, 1.0f64) - 0.8413447460685429).abs() < 1e-15);
        assert!((unary(UnaryOp::GeluTanh, 1.0f32) - 0.841192).abs() < 1e-6);
        assert_eq!(unary(UnaryOp::Sigmoid, 0.0f64), 0.5);
    }

    #[test]
    fn the_tail_functions_keep_relative_precision_near_zero() {
        let rel = |got: f64, want: f64| ((got - want) / want).abs();
        // log1p, expm1 and erf of tiny arguments: the naive forms give 0 or lose every digit.
        assert!(rel(unary(UnaryOp::Log1p, 1e-10), 1e-10 - 5e-21) < 1e-15);
        assert!(rel(unary(UnaryOp::Expm1, -1e-10), -1e-10 + 5e-21) < 1e-15);
        assert!(rel(unary(UnaryOp::Erf, 1e-8), 1.1283791670955126e-8) < 1e-15);
        assert!(rel(unary(UnaryOp::Log1p, 1e-7f32) as f64, 1e-7) < 1e-6);
        // softplus: e^x far below 1 for very negative x, x itself for large x, no overflow.
        let e = (-30f64).exp();
        assert!(rel(unary(UnaryOp::Softplus, -30.0), e * (1.0 - e / 2.0)) < 1e-15);
        assert!(rel(unary(UnaryOp::Softplus, -90.0f32) as f64, (-90f64).exp()) < 1e-6);
        assert_eq!(unary(UnaryOp::Softplus, 1000.0f32), 1000.0);
        assert!(rel(unary(UnaryOp::Softplus, 0.0), std::f64::consts::LN_2) < 1e-15);
        assert_eq!(derivative(UnaryOp::Softplus, 0.0f64), 0.5);
        assert!(unary(UnaryOp::Softplus, f64::NAN).is_nan());
    }
}
