//! Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1G`, `1e3`,
//! `1.5Gi`), parsed the way `resource.ParseQuantity` reads them.
//!
//! A quantity is `<signed number><suffix>`, where the suffix is a binary SI
//! suffix (`Ki`…`Ei`), a decimal SI suffix (`n`, `u`, `m`, ``, `k`, `M`, `G`,
//! `T`, `P`, `E`) or a decimal exponent (`e3`, `E-2`). The value is kept
//! exactly as a rational `mantissa × 10^exp10 × 2^exp2` so `0.1` CPU is exactly
//! 100 millicores, then rounded up like Kubernetes does when asked for an
//! integer in a given unit.

use crate::echo::Echo;

/// Errors of quantity parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is not a quantity.
    #[error(
        "{:?} is not a Kubernetes quantity ({reason}); e.g. 100m, 0.5, 2, 128Mi, 1G, 1e3",
        Echo(.text)
    )]
    Invalid {
        /// What was given.
        text: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The quantity does not fit what it is used for.
    #[error("quantity {:?} is out of range", Echo(.text))]
    OutOfRange {
        /// What was given.
        text: String,
    },
    /// Negative quantities make no sense as limits.
    #[error("quantity {:?} is negative; a limit must be positive", Echo(.text))]
    Negative {
        /// What was given.
        text: String,
    },
}

/// A parsed quantity: `digits × 10^exp10 × 2^exp2`, sign separate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    text: String,
    negative: bool,
    /// The decimal digits without the point, leading zeros removed.
    digits: u128,
    exp10: i32,
    exp2: u32,
}

impl Quantity {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let invalid = |reason| QuantityError::Invalid {
            text: text.to_string(),
            reason,
        };
        let s = text.trim();
        if s.is_empty() {
            return Err(invalid("empty"));
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err(invalid("no number"));
        }
        if number.matches('.').count() > 1 {
            return Err(invalid("more than one decimal point"));
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let mut digits: u128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            let d = u128::from(c as u8 - b'0');
            digits = digits
                .checked_mul(10)
                .and_then(|v| v.checked_add(d))
                .ok_or(QuantityError::OutOfRange {
                    text: text.to_string(),
                })?;
        }
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| invalid("too many digits"))?;
        let (suffix_exp10, exp2) = parse_suffix(suffix).ok_or_else(|| invalid("unknown suffix"))?;
        Ok(Self {
            text: text.to_string(),
            negative,
            digits,
            exp10: suffix_exp10 - frac_len,
            exp2,
        })
    }

    /// The value in units of `10^scale` (e.g. `-3` for milli), rounded up to
    /// an integer, as Kubernetes' `ScaledValue` does.
    pub fn scaled_ceil(&self, scale: i32) -> Result<u64, QuantityError> {
        if self.negative && self.digits != 0 {
            return Err(QuantityError::Negative {
                text: self.text.clone(),
            });
        }
        let range = || QuantityError::OutOfRange {
            text: self.text.clone(),
        };
        // value = digits × 2^exp2 × 10^(exp10 - scale)
        let mut numerator = self
            .digits
            .checked_mul(1u128.checked_shl(self.exp2).ok_or_else(range)?)
            .ok_or_else(range)?;
        let shift = self.exp10 - scale;
        let mut denominator: u128 = 1;
        if shift >= 0 {
            for _ in 0..shift {
                if numerator == 0 {
                    break;
                }
                numerator = numerator.checked_mul(10).ok_or_else(range)?;
            }
        } else {
            for _ in 0..(-shift) {
                denominator = match denominator.checked_mul(10) {
                    Some(d) => d,
                    // Dividing by more than 10^38 leaves at most a fraction.
                    None => return Ok(u64::from(numerator != 0)),
                };
            }
        }
        let value = numerator.div_ceil(denominator);
        u64::try_from(value).map_err(|_| range())
    }

    /// Whole bytes (rounded up): for memory.
    pub fn bytes(&self) -> Result<u64, QuantityError> {
        self.scaled_ceil(0)
    }

    /// Millicores (rounded up): for CPU.
    pub fn millis(&self) -> Result<u64, QuantityError> {
        self.scaled_ceil(-3)
    }
}

/// `(power of ten, power of two)` of a suffix.
fn parse_suffix(suffix: &str) -> Option<(i32, u32)> {
    let binary = |n: u32| Some((0, n * 10));
    match suffix {
        "" => Some((0, 0)),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        "n" => Some((-9, 0)),
        "u" => Some((-6, 0)),
        "m" => Some((-3, 0)),
        "k" => Some((3, 0)),
        "M" => Some((6, 0)),
        "G" => Some((9, 0)),
        "T" => Some((12, 0)),
        "P" => Some((15, 0)),
        "E" => Some((18, 0)),
        _ => {
            // A decimal exponent: e3, E-2, e+5.
            let rest = suffix.strip_prefix(['e', 'E'])?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) || digits.len() > 4
            {
                return None;
            }
            let exp: i32 = rest.parse().ok()?;
            Some((exp, 0))
        }
    }
}

/// `bytes` for a message: the largest binary suffix that divides it exactly
/// (`32Mi`), the plain number otherwise, with the bytes spelled out.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 5] = [("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{suffix} ({bytes} bytes)", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(s: &str) -> u64 {
        Quantity::parse(s).unwrap().millis().unwrap()
    }
    fn bytes(s: &str) -> u64 {
        Quantity::parse(s).unwrap().bytes().unwrap()
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(millis("100m"), 100);
        assert_eq!(millis("0.5"), 500);
        assert_eq!(millis(".5"), 500);
        assert_eq!(millis("2"), 2000);
        assert_eq!(millis("1.5"), 1500);
        assert_eq!(millis("+1"), 1000);
        assert_eq!(millis("1e3"), 1_000_000);
        assert_eq!(millis("1E-3"), 1);
        assert_eq!(millis("2e-1"), 200);
        assert_eq!(millis("1k"), 1_000_000);
        assert_eq!(millis("0"), 0);
        assert_eq!(millis("5."), 5000);
    }

    #[test]
    fn rounds_up_like_kubernetes() {
        assert_eq!(millis("0.0001"), 1);
        assert_eq!(millis("100u"), 1);
        assert_eq!(millis("1n"), 1);
        assert_eq!(bytes("0.5"), 1);
        assert_eq!(bytes("1.5Ki"), 1536);
        assert_eq!(bytes("1m"), 1);
        assert_eq!(bytes("1e-50"), 1);
        assert_eq!(bytes("0e-50"), 0);
    }

    #[test]
    fn memory_forms() {
        assert_eq!(bytes("128Mi"), 128 * 1024 * 1024);
        assert_eq!(bytes("1G"), 1_000_000_000);
        assert_eq!(bytes("1.5Gi"), 1_610_612_736);
        assert_eq!(bytes("1e3"), 1000);
        assert_eq!(bytes("1e+3"), 1000);
        assert_eq!(bytes("64k"), 64_000);
        assert_eq!(bytes("1Ki"), 1024);
        assert_eq!(bytes("1Ti"), 1 << 40);
        assert_eq!(bytes("1Pi"), 1 << 50);
        assert_eq!(bytes("2Ei"), 2 << 60);
        assert_eq!(bytes("1T"), 1_000_000_000_000);
        assert_eq!(bytes("1P"), 1_000_000_000_000_000);
        assert_eq!(bytes("1E"), 1_000_000_000_000_000_000);
        assert_eq!(bytes("1M"), 1_000_000);
        assert_eq!(bytes(" 42 "), 42);
    }

    #[test]
    fn bad_quantities_are_refused_clearly() {
        for bad in [
            "", " ", "abc", "1.2.3", "Mi", "12Q", "1mi", "1KI", "1e", "1e+", "1ee3", "1 Mi", "--1",
            ".", "1e99999", "0x10", "1,5",
        ] {
            let err = Quantity::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("is not a Kubernetes quantity"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn negative_and_huge_are_errors() {
        let err = Quantity::parse("-1").unwrap().bytes().unwrap_err();
        assert!(matches!(err, QuantityError::Negative { .. }), "{err}");
        assert_eq!(Quantity::parse("-0").unwrap().bytes().unwrap(), 0);
        let err = Quantity::parse("100Ei").unwrap().bytes().unwrap_err();
        assert!(matches!(err, QuantityError::OutOfRange { .. }), "{err}");
        let err = Quantity::parse("1e30").unwrap().bytes().unwrap_err();
        assert!(matches!(err, QuantityError::OutOfRange { .. }), "{err}");
        let err = Quantity::parse("99999999999999999999999999999999999999999").unwrap_err();
        assert!(matches!(err, QuantityError::OutOfRange { .. }), "{err}");
    }

    #[test]
    fn bytes_are_formatted_with_binary_suffixes() {
        assert_eq!(format_bytes(32 << 20), "32Mi (33554432 bytes)");
        assert_eq!(format_bytes(1 << 30), "1Gi (1073741824 bytes)");
        assert_eq!(format_bytes(1000), "1000 bytes");
    }
}
