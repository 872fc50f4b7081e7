//! Kubernetes' CEL quantity library (apiserver `pkg/cel/library/quantity.go`
//! of v1.35) on apimachinery's `resource.Quantity`, which it is made of:
//! a quantity is held as Go holds it — an `int64Amount` (a 64-bit value
//! and a decimal scale) when `ParseQuantity` fits it in one, else an
//! `inf.Dec` (a big integer and a scale, rounded up to nanos) — and each
//! function does what its Go function does with it. The representation is
//! the API server's verdict: `isInteger()` and `asInteger()` are
//! `AsInt64()`, true only for an `int64Amount` of scale ≥ 0 that fits
//! (`quantity("1000m").isInteger()` is false, so is any `inf.Dec`).
//!
//! Why xfn's own and not kube-cel's (0.8): kube-cel normalises every
//! quantity to a 128-bit mantissa, so its `isInteger()` asks whether there
//! is a fraction (`quantity("9999999999999999999999999999999999999G")` was
//! an integer); its quantity type is private, so one function cannot be
//! replaced alone. `compareTo()`, `isGreaterThan()` and `isLessThan()` are
//! shared with kube-cel's semver: a semver is handed to kube-cel's.
//!
//! Bounded: Go rescales an `inf.Dec` by any power of ten (a 19-digit
//! quantity with `e999999999` takes Go minutes and gigabytes); here a
//! rescale past [`MAX_SHIFT`] digits is an error of the rule, never a pass.
use std::cmp::Ordering;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, ExecutionError, FunctionContext, Program, Value};
use num_bigint::BigInt;
use num_traits::{Signed, Zero};

/// The most decimal digits a value is shifted by.
const MAX_SHIFT: u64 = 4096;

/// A quantity as `resource.Quantity` holds it: `value × 10^scale`.
#[derive(Debug, Clone)]
pub(super) enum Quantity {
    /// `int64Amount`.
    Int { value: i64, scale: i32 },
    /// `inf.Dec`: `unscaled × 10^-scale` (inf's scale is upside down).
    Dec { unscaled: BigInt, scale: i64 },
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// `10^n`.
fn exp10(n: u64) -> Result<BigInt, String> {
    if n > MAX_SHIFT {
        return Err(format!(
            "the quantity would be shifted by {n} decimal digits, more than xfn's {MAX_SHIFT}"
        ));
    }
    Ok(num_traits::pow(BigInt::from(10), n as usize))
}

/// `parseQuantityString`'s parts: sign, the number as written, its
/// integer digits (leading zeros dropped), its fraction, its suffix.
struct Parts<'a> {
    positive: bool,
    value: &'a str,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

/// apimachinery's `parseQuantityString`.
fn split(s: &str) -> Result<Parts<'_>, String> {
    let b = s.as_bytes();
    let end = b.len();
    let mut parts = Parts {
        positive: true,
        value: "",
        num: "",
        denom: "",
        suffix: "",
    };
    let mut pos = 0;
    match b.first() {
        Some(b'-') => {
            parts.positive = false;
            pos += 1;
        }
        Some(b'+') => pos += 1,
        _ => {}
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        parts.num = "0";
        parts.value = "0";
        return Ok(parts);
    }
    let digits = |from: usize| (from..end).find(|&i| !b[i].is_ascii_digit());
    match digits(pos) {
        None => {
            parts.num = &s[pos..];
            parts.value = s;
            return Ok(parts);
        }
        Some(i) => {
            parts.num = if i == pos { "0" } else { &s[pos..i] };
            pos = i;
        }
    }
    if b[pos] == b'.' {
        pos += 1;
        match digits(pos) {
            None => {
                parts.denom = &s[pos..];
                parts.value = s;
                return Ok(parts);
            }
            Some(i) => {
                parts.denom = &s[pos..i];
                pos = i;
            }
        }
    }
    parts.value = &s[..pos];
    let start = pos;
    match (pos..end).find(|&i| !b"eEinumkKMGTP".contains(&b[i])) {
        None => {
            parts.suffix = &s[start..];
            return Ok(parts);
        }
        Some(i) => pos = i,
    }
    if matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    if digits(pos).is_none() {
        parts.suffix = &s[start..];
        return Ok(parts);
    }
    Err("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'".into())
}

/// The suffix's `(base, exponent, binary)` (`quantitySuffixer.interpret`).
fn interpret(suffix: &str) -> Option<(u32, i32, bool)> {
    let decimal = |e| Some((10, e, false));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => Some((2, 10, true)),
        "Mi" => Some((2, 20, true)),
        "Gi" => Some((2, 30, true)),
        "Ti" => Some((2, 40, true)),
        "Pi" => Some((2, 50, true)),
        "Ei" => Some((2, 60, true)),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E']).filter(|e| !e.is_empty())?;
            // Go truncates the 64-bit exponent to 32 bits.
            exponent.parse::<i64>().ok().map(|e| (10, e as i32, false))
        }
    }
}

impl Quantity {
    /// apimachinery's `ParseQuantity`.
    pub(super) fn parse(s: &str) -> Result<Quantity, String> {
        if s.is_empty() {
            return Err("quantities must match the regular expression".into());
        }
        if s == "0" {
            return Ok(Quantity::Int { value: 0, scale: 0 });
        }
        let parts = split(s)?;
        let (base, exponent, binary) =
            interpret(parts.suffix).ok_or("unable to parse quantity's suffix")?;
        let digits = (parts.num.len() + parts.denom.len()) as i64;
        let (mut scale, precision, mantissa) = match binary {
            false => (i64::from(exponent), 18 - digits, 1i64),
            true if parts.denom.is_empty() => (
                0,
                15 - parts.num.len() as i64 - i64::from(exponent) * 3 / 10 - 1,
                1i64 << exponent,
            ),
            true => (0, -1, 1),
        };
        if precision >= 0 {
            scale -= parts.denom.len() as i64;
            if scale >= -9 {
                let shifted = format!("{}{}", parts.num, parts.denom);
                let value: i64 = shifted
                    .parse()
                    .map_err(|_| "unable to parse numeric part of quantity")?;
                if let Some(result) = value.checked_mul(mantissa) {
                    let value = if parts.positive { result } else { -result };
                    // `scale` is the 32-bit exponent less at most 18.
                    let scale = i32::try_from(scale).map_err(|_| "quantity scale overflow")?;
                    return Ok(Quantity::Int { value, scale });
                }
            }
        }
        // inf.Dec's SetString of the number as written.
        let written = parts.value.trim_start_matches(['+', '-']);
        let (int, fraction) = written.split_once('.').unwrap_or((written, ""));
        if int.is_empty() && fraction.is_empty()
            || !int
                .bytes()
                .chain(fraction.bytes())
                .all(|b| b.is_ascii_digit())
        {
            return Err("unable to parse numeric part of quantity".into());
        }
        let mut unscaled: BigInt = format!("{int}{fraction}")
            .parse()
            .map_err(|_| "unable to parse numeric part of quantity")?;
        let mut scale = fraction.len() as i64;
        if base == 10 {
            scale -= i64::from(exponent);
        } else {
            unscaled <<= exponent as usize;
        }
        // Rounded up to nanos (`inf.RoundUp`, away from zero).
        if !unscaled.is_zero() {
            if scale > 9 {
                let divisor = exp10((scale - 9) as u64)?;
                let (q, r) = (&unscaled / &divisor, &unscaled % &divisor);
                unscaled = if r.is_zero() { q } else { q + 1 };
            } else {
                unscaled *= exp10((9 - scale) as u64)?;
            }
            scale = 9;
        }
        let max = Quantity::Int {
            value: i64::MAX,
            scale: 0,
        };
        let rounded = Quantity::Dec {
            unscaled: unscaled.clone(),
            scale,
        };
        if binary && rounded.cmp(&max) == Ordering::Greater {
            unscaled = BigInt::from(i64::MAX);
            scale = 0;
        }
        if !parts.positive {
            unscaled = -unscaled;
        }
        Ok(Quantity::Dec { unscaled, scale })
    }

    /// `value × 10^exponent`.
    fn decimal(&self) -> (BigInt, i64) {
        match self {
            Quantity::Int { value, scale } => (BigInt::from(*value), i64::from(*scale)),
            Quantity::Dec { unscaled, scale } => (unscaled.clone(), -scale),
        }
    }

    /// `Cmp()`: the values compared exactly (orders of magnitude first,
    /// so no value is shifted by more digits than it has).
    fn cmp(&self, other: &Quantity) -> Ordering {
        let ((a, x), (b, y)) = (self.decimal(), other.decimal());
        let sign = |v: &BigInt| v.sign() as i8;
        match sign(&a).cmp(&sign(&b)) {
            Ordering::Equal if a.is_zero() => return Ordering::Equal,
            Ordering::Equal => {}
            decided => return decided,
        }
        let order = |v: &BigInt, e: i64| v.abs().to_string().len() as i64 + e;
        let magnitude = match order(&a, x).cmp(&order(&b, y)) {
            Ordering::Equal => {
                let shift = |v: BigInt, by: i64| v * num_traits::pow(BigInt::from(10), by as usize);
                let low = x.min(y);
                shift(a.abs(), x - low).cmp(&shift(b.abs(), y - low))
            }
            decided => decided,
        };
        if a.is_negative() {
            magnitude.reverse()
        } else {
            magnitude
        }
    }

    fn sign(&self) -> i64 {
        match self {
            Quantity::Int { value, .. } => value.signum(),
            Quantity::Dec { unscaled, .. } => unscaled.sign() as i64 - 1,
        }
    }

    /// `AsInt64()`.
    fn as_int64(&self) -> Option<i64> {
        match *self {
            Quantity::Int { value, scale } if scale >= 0 => {
                if value == 0 {
                    return Some(0);
                }
                (0..scale).try_fold(value, |v, _| v.checked_mul(10))
            }
            _ => None,
        }
    }

    /// `AsApproximateFloat64()`: the unscaled value times Go's `Pow10`.
    fn as_approximate_float(&self) -> f64 {
        let (base, exponent) = match self {
            Quantity::Int { value, scale } => (*value as f64, i64::from(*scale)),
            Quantity::Dec { unscaled, scale } => {
                (unscaled.to_string().parse().unwrap_or(f64::NAN), -scale)
            }
        };
        if exponent == 0 {
            base
        } else {
            base * pow10(exponent)
        }
    }

    /// `Add()` (`Sub()` of `-y`): `int64Amount`s while they fit, else
    /// `inf.Dec` at the finer scale.
    fn add(&self, other: &Quantity, negate: bool) -> Result<Quantity, String> {
        if let (Quantity::Int { value: a, scale: x }, Quantity::Int { value: b, scale: y }) =
            (self, other)
        {
            let b = if negate { b.wrapping_neg() } else { *b };
            if let Some(sum) = int_add(*a, *x, b, *y) {
                return Ok(sum);
            }
        }
        let ((a, x), (b, y)) = (self.decimal(), other.decimal());
        let b = if negate { -b } else { b };
        let low = x.min(y);
        let a = a * exp10((x - low) as u64)?;
        let b = b * exp10((y - low) as u64)?;
        Ok(Quantity::Dec {
            unscaled: a + b,
            scale: -low,
        })
    }
}

/// `int64Amount.Add`.
fn int_add(a: i64, x: i32, b: i64, y: i32) -> Option<Quantity> {
    let scaled = |v: i64, by: i32| {
        if v == 0 {
            return Some(0);
        }
        (0..by).try_fold(v, |v, _| v.checked_mul(10))
    };
    let (value, scale) = match () {
        _ if b == 0 => (a, x),
        _ if a == 0 => (b, y),
        _ if x == y => (a.checked_add(b)?, x),
        _ if x > y => (scaled(a, x - y)?.checked_add(b)?, y),
        _ => (a.checked_add(scaled(b, y - x)?)?, x),
    };
    Some(Quantity::Int { value, scale })
}

/// Go's `math.Pow10`, from the same tables (so the products round alike).
fn pow10(n: i64) -> f64 {
    const TAB: [f64; 32] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29, 1e30, 1e31,
    ];
    const POSITIVE: [f64; 10] = [
        1e0, 1e32, 1e64, 1e96, 1e128, 1e160, 1e192, 1e224, 1e256, 1e288,
    ];
    const NEGATIVE: [f64; 11] = [
        1e0, 1e-32, 1e-64, 1e-96, 1e-128, 1e-160, 1e-192, 1e-224, 1e-256, 1e-288, 1e-320,
    ];
    match n {
        0..=308 => POSITIVE[n as usize / 32] * TAB[n as usize % 32],
        -323..=-1 => NEGATIVE[(-n) as usize / 32] / TAB[(-n) as usize % 32],
        n if n > 0 => f64::INFINITY,
        _ => 0.0,
    }
}

/// Registers the library in `context`, over kube-cel's.
pub(super) fn register(context: &mut Context) {
    context.add_function("quantity", |ftx: &FunctionContext, s: Arc<String>| {
        Quantity::parse(&s)
            .map(|q| Value::Opaque(Arc::new(q)))
            .map_err(|e| ftx.error(e))
    });
    context.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
    context.add_function("isInteger", |ftx: &FunctionContext, this: This<Value>| {
        quantity(ftx, &this.0).map(|q| Value::Bool(q.as_int64().is_some()))
    });
    context.add_function("asInteger", |ftx: &FunctionContext, this: This<Value>| {
        quantity(ftx, &this.0)?
            .as_int64()
            .map(Value::Int)
            .ok_or_else(|| ftx.error("cannot convert value to integer"))
    });
    context.add_function(
        "asApproximateFloat",
        |ftx: &FunctionContext, this: This<Value>| {
            quantity(ftx, &this.0).map(|q| Value::Float(q.as_approximate_float()))
        },
    );
    context.add_function("sign", |ftx: &FunctionContext, this: This<Value>| {
        quantity(ftx, &this.0).map(|q| Value::Int(q.sign()))
    });
    context.add_function(
        "add",
        |ftx: &FunctionContext, this: This<Value>, other: Value| {
            arithmetic(ftx, &this.0, &other, false)
        },
    );
    context.add_function(
        "sub",
        |ftx: &FunctionContext, this: This<Value>, other: Value| {
            arithmetic(ftx, &this.0, &other, true)
        },
    );
    context.add_function(
        "compareTo",
        |ftx: &FunctionContext, this: This<Value>, other: Value| {
            compare(ftx, &this.0, &other, 2, |o| Value::Int(o as i64))
        },
    );
    context.add_function(
        "isGreaterThan",
        |ftx: &FunctionContext, this: This<Value>, other: Value| {
            compare(ftx, &this.0, &other, 0, |o| {
                Value::Bool(o == Ordering::Greater)
            })
        },
    );
    context.add_function(
        "isLessThan",
        |ftx: &FunctionContext, this: This<Value>, other: Value| {
            compare(ftx, &this.0, &other, 1, |o| {
                Value::Bool(o == Ordering::Less)
            })
        },
    );
}

fn quantity<'v>(ftx: &FunctionContext, value: &'v Value) -> Result<&'v Quantity, ExecutionError> {
    match value {
        Value::Opaque(o) => o.downcast_ref::<Quantity>(),
        _ => None,
    }
    .ok_or_else(|| {
        ftx.error(format!(
            "no such overload: expects a quantity, not {value:?}"
        ))
    })
}

/// `add()`, `sub()` of a quantity or an integer (`NewQuantity(n, …)`:
/// an `int64Amount` of scale 0).
fn arithmetic(
    ftx: &FunctionContext,
    this: &Value,
    other: &Value,
    negate: bool,
) -> Result<Value, ExecutionError> {
    let this = quantity(ftx, this)?;
    let other = match other {
        Value::Int(n) => Quantity::Int {
            value: *n,
            scale: 0,
        },
        other => quantity(ftx, other)?.clone(),
    };
    this.add(&other, negate)
        .map(|q| Value::Opaque(Arc::new(q)))
        .map_err(|e| ftx.error(e))
}

/// kube-cel's `isGreaterThan()`, `isLessThan()`, `compareTo()` (the
/// `which`th), for a semver.
static DELEGATED: [&str; 3] = ["a.isGreaterThan(b)", "a.isLessThan(b)", "a.compareTo(b)"];

thread_local! {
    /// kube-cel's libraries alone, and the calls handed to them.
    static KUBE: (Context<'static>, Vec<Option<Program>>) = {
        use kube_cel::KubeCelExt;
        let mut context = Context::default();
        context.register_all();
        let programs = DELEGATED.iter().map(|p| Program::compile(p).ok()).collect();
        (context, programs)
    };
}

/// A comparison: of two quantities here, of anything else by kube-cel.
fn compare(
    ftx: &FunctionContext,
    this: &Value,
    other: &Value,
    which: usize,
    answer: fn(Ordering) -> Value,
) -> Result<Value, ExecutionError> {
    if let Value::Opaque(o) = this {
        if let Some(q) = o.downcast_ref::<Quantity>() {
            return Ok(answer(q.cmp(quantity(ftx, other)?)));
        }
    }
    KUBE.with(|(context, programs)| {
        let program = programs
            .get(which)
            .and_then(Option::as_ref)
            .ok_or_else(|| ftx.error("comparison unavailable"))?;
        let mut scope = context.new_inner_scope();
        scope.add_variable_from_value("a", this.clone());
        scope.add_variable_from_value("b", other.clone());
        program
            .execute(&scope)
            .map_err(|e| ftx.error(e.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    /// What apimachinery v0.35.3's `ParseQuantity` makes of each string
    /// (`AsInt64()`, `AsApproximateFloat64()`, `Sign()`, or an error), as
    /// Go printed it (quantity.go's examples, quantity_test.go's inputs,
    /// and the edges of the two representations).
    #[test]
    fn each_quantity_is_what_apimachinery_makes_of_it() {
        #[allow(clippy::type_complexity)]
        let facts: &[(&str, Option<(Option<i64>, f64, i64)>)] = &[
            ("Mi", Some((Some(0), 0_f64, 0))),
            ("", None),
            (" 1", None),
            ("20Mo", None),
            ("10Mm", None),
            ("200K", None),
            ("Three", None),
            ("1,3G", None),
            ("1e", None),
            ("1.2.3", None),
            ("+", Some((Some(0), 0_f64, 0))),
            ("-", Some((Some(0), 0_f64, 0))),
            (".", Some((Some(0), 0_f64, 0))),
            ("1.", Some((Some(1), 1_f64, 1))),
            (".5", Some((None, 0.5_f64, 1))),
            ("1e3", Some((Some(1000), 1000_f64, 1))),
            ("1E-3", Some((None, 0.001_f64, 1))),
            ("-0.000000001", Some((None, -1e-09_f64, -1))),
            ("1000m", Some((None, 1_f64, 1))),
            ("0.5k", Some((Some(500), 500_f64, 1))),
            (
                "9999999999999999999999999999999999999G",
                Some((None, 1.0000000000000001e+46_f64, 1)),
            ),
            ("1e999999999", Some((None, f64::INFINITY, 1))),
            ("9Ei", Some((None, 9.223372036854776e+18_f64, 1))),
            ("1e-10", Some((None, 1e-09_f64, 1))),
            ("1n", Some((None, 1e-09_f64, 1))),
            ("1.5Gi", Some((None, 1.610612736e+09_f64, 1))),
            ("0.1Ki", Some((None, 102.4_f64, 1))),
            (
                "12345678901234567890",
                Some((None, 1.234567890123457e+19_f64, 1)),
            ),
            (
                "-12345678901234567890m",
                Some((None, -1.234567890123457e+16_f64, -1)),
            ),
            (
                "1.23456789012345678e5",
                Some((None, 123456.78901234601_f64, 1)),
            ),
            ("7Ei", Some((None, 8.070450532247929e+18_f64, 1))),
            ("8Ei", Some((None, 9.223372036854776e+18_f64, 1))),
            ("1e308", Some((None, 1e+308_f64, 1))),
            ("5e-324", Some((None, 1e-09_f64, 1))),
            ("0.0001n", Some((None, 1e-09_f64, 1))),
            ("123.456789m", Some((None, 0.12345678900000001_f64, 1))),
            ("1e-9", Some((None, 1e-09_f64, 1))),
            ("-1e19", Some((None, -1e+19_f64, -1))),
            ("1E", Some((Some(1000000000000000000), 1e+18_f64, 1))),
            ("100Pi", Some((None, 1.125899906842624e+17_f64, 1))),
            ("50k", Some((Some(50000), 50000_f64, 1))),
            ("50000000G", Some((Some(50000000000000000), 5e+16_f64, 1))),
        ];
        for (text, expected) in facts {
            let got = Quantity::parse(text)
                .ok()
                .map(|q| (q.as_int64(), q.as_approximate_float(), q.sign()));
            assert_eq!(&got, expected, "{text:?}");
        }
    }

    #[test]
    fn quantities_parse_compare_and_add_as_go_s() {
        assert_eq!(q("200M"), q("0.2G"));
        assert_eq!(q("2000k"), q("2M"));
        assert_eq!(q("50M").cmp(&q("50Mi")), Ordering::Less);
        assert_eq!(q("150Mi").cmp(&q("100Mi")), Ordering::Greater);
        assert_eq!(q("50k").add(&q("20"), false).unwrap(), q("50.02k"));
        assert_eq!(q("50k").add(&q("20k"), true).unwrap(), q("30k"));
        let sum = q("50k")
            .add(
                &Quantity::Int {
                    value: 20,
                    scale: 0,
                },
                false,
            )
            .unwrap()
            .add(&q("100k"), true)
            .unwrap()
            .add(
                &Quantity::Int {
                    value: -50_000,
                    scale: 0,
                },
                true,
            )
            .unwrap();
        assert_eq!(sum, q("20"));
        assert_eq!(q("-1.5").sign(), -1);
        assert_eq!(q("0").sign(), 0);
        assert_eq!(q("123456789012345678901234567890").sign(), 1);
        assert_eq!(
            q("50k").add(&q("20"), true).unwrap().as_approximate_float(),
            49980.0
        );
        assert_eq!(q("9Ei"), q("9223372036854775807"), "capped at 2^63-1");
        assert_eq!(q("1n").as_approximate_float(), 1e-9);
        assert_eq!(q("1e-10"), q("1n"), "rounded up to nanos");
    }

    #[test]
    fn a_huge_exponent_is_refused_not_expanded() {
        let huge = Quantity::parse("1234567890123456789e999999999");
        assert!(huge.unwrap_err().contains("more than xfn's"));
        // An int64Amount with a huge scale compares without expanding.
        assert_eq!(q("1e999999999").cmp(&q("1e999999998")), Ordering::Greater);
    }
}
