//! CRC32C arithmetic: the CRC of two runs of bytes one after the other, from the CRCs of each.
//!
//! Why: a replication answer's frame CRC covers its record batches, and every batch carries its own
//! CRC32C over all of it but its first 21 bytes, which the follower's storage checks before it appends
//! anything. Reading each record byte twice, once for the frame and once for its batch, is a pass over
//! the data the follower does not need: the frame's CRC follows from the batch's own (see
//! `replication::frame_crc_of_fetch_result`), with [`concat`].
//!
//! The algebra: the CRC32C of `a` then `b` is `crc(a) · x^(8·len(b)) mod P` xor `crc(b)` (the initial
//! and final inversions of the standard CRC32C cancel out in this form). Polynomials over GF(2) of degree
//! below 32 are held in the CRC's own bit order: the top bit is the coefficient of x^0, the lowest that of
//! x^31. What must never happen: an answer other than `crc32c(a ++ b)`; the tests compare it with the
//! crate that computes CRCs byte by byte.

/// CRC32C's (Castagnoli's) polynomial without its x^32 term, in the bit order above.
const POLY: u32 = 0x82F6_3B78;
/// The polynomial `1`.
const ONE: u32 = 1 << 31;

/// `a · b mod P`.
const fn mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut term = ONE;
    // At each step `b` holds the original `b · x^i`, and `term` picks `a`'s coefficient of x^i.
    while term != 0 {
        if a & term != 0 {
            product ^= b;
        }
        // Times x: one place towards x^31; an x^32 that falls off is replaced by its remainder mod P.
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        term >>= 1;
    }
    product
}

/// `x^(2^k) mod P` for every `k` a bit count in a `u64` can need.
const X_POW_2K: [u32; 64] = {
    let mut table = [0u32; 64];
    table[0] = ONE >> 1; // x^1
    let mut k = 1;
    while k < 64 {
        table[k] = mul(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `crc · x^(8·bytes) mod P`: the CRC carried past `bytes` bytes that add nothing of their own.
fn shift(mut crc: u32, bytes: u64) -> u32 {
    // 8·bytes in bits: a u64 byte count beyond 2^61 is no length in memory.
    let mut bits = bytes << 3;
    let mut k = 0;
    while bits != 0 {
        if bits & 1 != 0 {
            crc = mul(crc, X_POW_2K[k]);
        }
        bits >>= 1;
        k += 1;
    }
    crc
}

/// The CRC32C of `a` followed by `b`, from `crc_a` (the CRC32C of `a`), `crc_b` (that of `b`) and `b`'s
/// length. A cost of at most one multiplication per set bit of the length, whatever the length.
pub fn concat(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    shift(crc_a, len_b as u64) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    #[test]
    fn concat_gives_the_crc_of_the_bytes_one_after_the_other() {
        let data = bytes(70_000, 0x9E37_79B9_7F4A_7C15);
        for split in [0, 1, 2, 7, 21, 64, 1000, 4095, 4096, 4097, 65_536, 69_999, 70_000] {
            let (a, b) = data.split_at(split);
            let expected = crc32c::crc32c(&data);
            assert_eq!(concat(crc32c::crc32c(a), crc32c::crc32c(b), b.len()), expected, "split at {split}");
        }
    }

    #[test]
    fn concat_of_many_runs_gives_the_crc_of_them_all() {
        let data = bytes(300_000, 0x2545_F491_4F6C_DD1D);
        let mut crc = crc32c::crc32c(&[]);
        let mut at = 0;
        for (i, len) in [17usize, 1, 4096, 100_000, 3, 0, 65_535, 21, 130_327].into_iter().enumerate() {
            let part = &data[at..at + len];
            crc = if i % 2 == 0 { concat(crc, crc32c::crc32c(part), len) } else { crc32c::crc32c_append(crc, part) };
            at += len;
        }
        assert_eq!(at, data.len());
        assert_eq!(crc, crc32c::crc32c(&data));
    }

    #[test]
    fn multiplication_by_one_and_by_x() {
        let c = 0xDEAD_BEEF;
        assert_eq!(mul(c, ONE), c);
        assert_eq!(mul(ONE, c), c);
        assert_eq!(mul(ONE >> 1, ONE >> 1), ONE >> 2, "x · x = x^2");
        assert_eq!(shift(c, 0), c);
    }
}
