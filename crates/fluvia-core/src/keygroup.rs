//! Key groups, exactly as Flink computes them (`KeyGroupRangeAssignment`,
//! `MathUtils.murmurHash`), so that a key lands on the same key group as in a
//! Flink job with the same max parallelism.
//!
//! The key's hash is Java's `hashCode` for the common types ([`KeyHash`]), which
//! makes routing of `i32`, `i64` and `String` keys identical to Flink's.

/// Upper bound of max parallelism (Flink's `UPPER_BOUND_MAX_PARALLELISM`).
pub const UPPER_BOUND_MAX_PARALLELISM: usize = 1 << 15;
/// Lower bound of the *default* max parallelism.
pub const DEFAULT_LOWER_BOUND_MAX_PARALLELISM: usize = 1 << 7;

/// Java-compatible `hashCode` of a key.
pub trait KeyHash {
    fn key_hash(&self) -> i32;
}

impl KeyHash for i32 {
    fn key_hash(&self) -> i32 {
        *self
    }
}
impl KeyHash for u32 {
    fn key_hash(&self) -> i32 {
        *self as i32
    }
}
impl KeyHash for i16 {
    fn key_hash(&self) -> i32 {
        *self as i32
    }
}
impl KeyHash for u8 {
    fn key_hash(&self) -> i32 {
        *self as i8 as i32
    }
}
impl KeyHash for i64 {
    fn key_hash(&self) -> i32 {
        (*self ^ ((*self as u64) >> 32) as i64) as i32
    }
}
impl KeyHash for u64 {
    fn key_hash(&self) -> i32 {
        (*self as i64).key_hash()
    }
}
impl KeyHash for usize {
    fn key_hash(&self) -> i32 {
        (*self as i64).key_hash()
    }
}
impl KeyHash for bool {
    fn key_hash(&self) -> i32 {
        if *self { 1231 } else { 1237 }
    }
}
impl KeyHash for char {
    fn key_hash(&self) -> i32 {
        *self as i32
    }
}
impl KeyHash for str {
    fn key_hash(&self) -> i32 {
        // String.hashCode over UTF-16 code units.
        self.encode_utf16()
            .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
    }
}
impl KeyHash for String {
    fn key_hash(&self) -> i32 {
        self.as_str().key_hash()
    }
}
impl<T: KeyHash + ?Sized> KeyHash for &T {
    fn key_hash(&self) -> i32 {
        (**self).key_hash()
    }
}
impl<A: KeyHash, B: KeyHash> KeyHash for (A, B) {
    fn key_hash(&self) -> i32 {
        // Flink's Tuple2.hashCode.
        self.0
            .key_hash()
            .wrapping_mul(31)
            .wrapping_add(self.1.key_hash())
    }
}
impl<A: KeyHash, B: KeyHash, C: KeyHash> KeyHash for (A, B, C) {
    fn key_hash(&self) -> i32 {
        let h = self
            .0
            .key_hash()
            .wrapping_mul(31)
            .wrapping_add(self.1.key_hash());
        h.wrapping_mul(31).wrapping_add(self.2.key_hash())
    }
}

fn bit_mix(mut h: i32) -> i32 {
    h ^= ((h as u32) >> 16) as i32;
    h = h.wrapping_mul(0x85eb_ca6bu32 as i32);
    h ^= ((h as u32) >> 13) as i32;
    h = h.wrapping_mul(0xc2b2_ae35u32 as i32);
    h ^= ((h as u32) >> 16) as i32;
    h
}

/// Flink's `MathUtils.murmurHash(int)`: a non-negative mixed hash.
#[inline]
pub fn murmur_hash(code: i32) -> i32 {
    let mut code = code.wrapping_mul(0xcc9e_2d51u32 as i32);
    code = code.rotate_left(15);
    code = code.wrapping_mul(0x1b87_3593);
    code = code.rotate_left(13);
    code = code.wrapping_mul(5).wrapping_add(0xe654_6b64u32 as i32);
    code ^= 4;
    code = bit_mix(code);
    if code >= 0 {
        code
    } else if code != i32::MIN {
        -code
    } else {
        0
    }
}

/// The key group of a key hash.
#[inline]
pub fn key_group_for_hash(key_hash: i32, max_parallelism: usize) -> usize {
    // 32-bit division is several times cheaper than 64-bit on the hot path;
    // both operands fit (murmur is non-negative, max parallelism ≤ 2^15).
    (murmur_hash(key_hash) as u32 % max_parallelism as u32) as usize
}

/// The subtask (operator index) that owns a key group.
pub fn operator_index_for_key_group(
    max_parallelism: usize,
    parallelism: usize,
    key_group: usize,
) -> usize {
    key_group * parallelism / max_parallelism
}

/// The subtask that owns a key.
pub fn operator_index_for_key<K: KeyHash + ?Sized>(
    key: &K,
    max_parallelism: usize,
    parallelism: usize,
) -> usize {
    operator_index_for_key_group(
        max_parallelism,
        parallelism,
        key_group_for_hash(key.key_hash(), max_parallelism),
    )
}

/// The inclusive key-group range `[start, end]` owned by a subtask.
pub fn key_group_range_for_operator(
    max_parallelism: usize,
    parallelism: usize,
    operator_index: usize,
) -> (usize, usize) {
    let start = (operator_index * max_parallelism).div_ceil(parallelism);
    let end = ((operator_index + 1) * max_parallelism - 1) / parallelism;
    (start, end)
}

/// Flink's `computeDefaultMaxParallelism`: 1.5 × parallelism rounded up to a
/// power of two, within [128, 32768].
pub fn default_max_parallelism(parallelism: usize) -> usize {
    let p = (parallelism + parallelism / 2).max(1).next_power_of_two();
    p.clamp(
        DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
        UPPER_BOUND_MAX_PARALLELISM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_codes() {
        assert_eq!("hello".key_hash(), 99_162_322);
        assert_eq!("".key_hash(), 0);
        assert_eq!(7i64.key_hash(), 7);
        assert_eq!((-1i64).key_hash(), 0);
        assert_eq!((1i64 << 32).key_hash(), 1);
    }

    /// Key groups of a table of keys as a JVM computes them: Java's
    /// `hashCode`, Flink's `MathUtils.murmurHash`, max parallelism 128 and
    /// parallelism 4 (the rows were produced by a Java program).
    #[test]
    fn key_groups_match_a_jvm_for_a_table_of_keys() {
        let table: &[(&str, &str, i32, usize, usize)] = &[
            ("i32", "0", 0, 94, 2),
            ("i32", "1", 1, 86, 2),
            ("i32", "2", 2, 127, 3),
            ("i32", "7", 7, 113, 3),
            ("i32", "42", 42, 29, 0),
            ("i32", "-1", -1, 80, 2),
            ("i32", "1000", 1000, 7, 0),
            ("i32", "123456789", 123456789, 81, 2),
            ("i32", "-2147483648", -2147483648, 108, 3),
            ("i32", "2147483647", 2147483647, 62, 1),
            ("i64", "0", 0, 94, 2),
            ("i64", "1", 1, 86, 2),
            ("i64", "-1", 0, 94, 2),
            ("i64", "4294967296", 1, 86, 2),
            ("i64", "9007199254740993", 2097153, 3, 0),
            ("i64", "-9223372036854775808", -2147483648, 108, 3),
            ("str", "", 0, 94, 2),
            ("str", "a", 97, 81, 2),
            ("str", "hello", 99162322, 35, 1),
            ("str", "Flink", 67968320, 127, 3),
            ("str", "fluvia", -1271451329, 41, 1),
            ("str", "ÆØÅ", 197171, 36, 1),
            ("str", "the quick brown fox", 1302335171, 80, 2),
        ];
        for &(kind, key, hash, kg, op) in table {
            let h = match kind {
                "i32" => key.parse::<i32>().unwrap().key_hash(),
                "i64" => key.parse::<i64>().unwrap().key_hash(),
                _ => key.key_hash(),
            };
            assert_eq!(h, hash, "hashCode of {kind} {key}");
            assert_eq!(key_group_for_hash(h, 128), kg, "key group of {kind} {key}");
            assert_eq!(
                operator_index_for_key_group(128, 4, kg),
                op,
                "subtask of {kind} {key}"
            );
        }
    }

    #[test]
    fn murmur_is_non_negative_and_mixes() {
        for k in -1000..1000 {
            assert!(murmur_hash(k) >= 0);
        }
        assert_ne!(murmur_hash(1), murmur_hash(2));
        assert_eq!(murmur_hash(i32::MIN), murmur_hash(i32::MIN)); // deterministic
    }

    #[test]
    fn ranges_partition_all_key_groups_and_agree_with_routing() {
        for max_p in [128usize, 200, 1000] {
            for p in 1..=7usize {
                let mut next = 0;
                for op in 0..p {
                    let (s, e) = key_group_range_for_operator(max_p, p, op);
                    assert_eq!(s, next);
                    for kg in s..=e {
                        assert_eq!(operator_index_for_key_group(max_p, p, kg), op);
                    }
                    next = e + 1;
                }
                assert_eq!(next, max_p);
            }
        }
    }

    #[test]
    fn default_max_parallelism_matches_flink() {
        assert_eq!(default_max_parallelism(1), 128);
        assert_eq!(default_max_parallelism(100), 256);
        assert_eq!(default_max_parallelism(1000), 2048);
        assert_eq!(default_max_parallelism(100_000), 32768);
    }
}
