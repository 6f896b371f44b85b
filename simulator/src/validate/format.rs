//! Numbers as the report has always printed them (it began as a Python
//! script, and reports kept in bench/RESULTS.md are compared line by line
//! with new ones).

/// Seconds to a tenth, or `-` where there is no value.
pub(crate) fn tenths(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// A difference to a tenth, always with its sign, or `-`.
pub(crate) fn signed_tenths(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:+.1}"))
}

/// A number as Python's `repr` writes it (`15.0`, `0.004`, `5e-05`): the
/// shortest digits that read back, a `.0` on whole numbers, and an
/// exponent below 1e-4 and from 1e16. The classes file hands a notice to
/// job.sh's `sleep`, which takes every one of these forms.
pub(crate) fn python_float(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return match x {
            v if v.is_nan() => "nan".into(),
            v if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.into(),
            v => format!("{v:.1}"),
        };
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{x}");
        return if plain.contains('.') { plain } else { plain + ".0" };
    }
    format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_reprs() {
        let cases = [
            (15.0, "15.0"),
            (1.5, "1.5"),
            (0.004, "0.004"),
            (1.0 / 250.0, "0.004"),
            (1.0 / 3.0, "0.3333333333333333"),
            (0.0001, "0.0001"),
            (0.00005, "5e-05"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (123_456_789_012_345.0, "123456789012345.0"),
            (-2.0, "-2.0"),
            (0.0, "0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float(x), want, "{x}");
        }
    }

    #[test]
    fn tenths_round_half_to_even_on_the_binary_value_as_python_does() {
        // 0.25 and 0.75 are exact in binary: ties, to the even digit; 0.35
        // is just below its decimal, 0.45 just above.
        let got: Vec<String> = [0.25, 0.75, 0.35, 0.45, -0.04].iter().map(|v| tenths(Some(*v))).collect();
        assert_eq!(got, ["0.2", "0.8", "0.3", "0.5", "-0.0"]);
        assert_eq!(signed_tenths(Some(0.5)), "+0.5");
        assert_eq!(signed_tenths(Some(-1.0)), "-1.0");
        assert_eq!((tenths(None), signed_tenths(None)), ("-".to_string(), "-".to_string()));
    }
}
