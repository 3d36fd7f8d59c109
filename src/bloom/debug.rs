//! `BF.DEBUG`: RedisBloom's description of a filter, one line per sub-filter.

use crate::bloom::chain::Chain;
use crate::bloom::filter::Hashing;

/// `size:<items>`, then per sub-filter `bytes:.. bits:.. hashes:..
/// hashwidth:64 capacity:.. size:.. ratio:..` with the ratio as C's `%g`
/// (`hashwidth:32` for filters imported with RedisBloom's 32-bit hashes).
pub fn lines(chain: &Chain) -> Vec<String> {
    let mut out = vec![format!("size:{}", chain.items())];
    let width = match chain.hashing() {
        Hashing::Murmur32 => 32,
        Hashing::Xxh3 | Hashing::Murmur64 => 64,
    };
    for f in &chain.filters {
        let bytes = f.words().len() * 8;
        out.push(format!(
            "bytes:{bytes} bits:{} hashes:{} hashwidth:{width} capacity:{} size:{} ratio:{}",
            bytes * 8,
            f.hashes,
            f.capacity,
            f.items,
            format_g(f.error)
        ));
    }
    out
}

/// A number as C's `printf("%g")`: 6 significant digits, trailing zeros
/// removed, scientific notation below 1e-4 or from 1e6.
pub fn format_g(x: f64) -> String {
    const PRECISION: i32 = 6;
    if x == 0.0 || !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x.is_infinite() {
            if x > 0.0 { "inf" } else { "-inf" }.into()
        } else {
            "0".into()
        };
    }
    // The exponent after rounding to 6 significant digits.
    let sci = format!("{:.*e}", (PRECISION - 1) as usize, x);
    let (mantissa, exponent) = sci.split_once('e').expect("scientific notation");
    let exponent: i32 = exponent.parse().expect("an exponent");
    if (-4..PRECISION).contains(&exponent) {
        let decimals = (PRECISION - 1 - exponent) as usize;
        trim_zeros(&format!("{x:.decimals$}")).to_string()
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mantissa), exponent.abs())
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bloom::chain::Params;

    #[test]
    fn ratios_print_as_c_percent_g() {
        let cases = [
            (0.0005, "0.0005"),
            (0.01, "0.01"),
            (0.005, "0.005"),
            (0.000625, "0.000625"),
            (0.0001, "0.0001"),
            (0.00005, "5e-05"),
            (1.953125e-05, "1.95313e-05"),
            (1.0 / 3.0, "0.333333"),
            (0.1 / 1024.0, "9.76563e-05"),
            (2.0f64.powi(-40), "9.09495e-13"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.5, "0.5"),
            (0.999999, "0.999999"),
            (0.9999999, "1"),
        ];
        for (x, want) in cases {
            assert_eq!(format_g(x), want, "{x}");
        }
    }

    #[test]
    fn lines_describe_each_sub_filter() {
        let c = Chain::new(
            Params {
                capacity: 50000,
                error: 0.001,
                expansion: Some(2),
            },
            1 << 30,
        )
        .unwrap();
        assert_eq!(
            lines(&c),
            [
                "size:0",
                "bytes:98880 bits:791040 hashes:11 hashwidth:64 capacity:50000 size:0 ratio:0.0005"
            ]
        );
    }
}
