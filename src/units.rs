//! Byte counts for people: `12.00 GiB`, `9.14 MiB`, `412.0 KiB`, `16 B`.

pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// `1 turn`, `2 turns`, `0 turns`: a count with its noun, plural unless it is 1.
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    count_as(n, noun, &format!("{noun}s"))
}

/// A count with an irregular plural: `count_as(3, "entry", "entries")`.
pub fn count_as<N: std::fmt::Display + PartialEq + From<u8>>(
    n: N,
    one: &str,
    many: &str,
) -> String {
    let word = if n == N::from(1) { one } else { many };
    format!("{n} {word}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular() {
        assert_eq!(super::count(1usize, "turn"), "1 turn");
        assert_eq!(super::count(0u64, "turn"), "0 turns");
        assert_eq!(super::count(2u32, "GPU"), "2 GPUs");
        assert_eq!(super::count_as(1u64, "entry", "entries"), "1 entry");
    }
}
