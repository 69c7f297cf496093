//! xorshift64*: seeded, tiny, good enough for test and bench data. Shared by the kernel
//! tests (`mod common`) and benches/kernels.rs (`#[path]`).

use half::f16;

pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [-scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }
    pub fn f16s(&mut self, n: usize, scale: f32) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(self.f32(scale))).collect()
    }
    /// Uniform in [lo, hi) as f16 (norm weights).
    pub fn f16_range(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(lo + (self.f32(1.0) + 1.0) * 0.5 * (hi - lo)))
            .collect()
    }
    /// `n` random bytes (every bit pattern equally likely).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..n.div_ceil(8))
            .flat_map(|_| self.next_u64().to_le_bytes())
            .collect();
        v.truncate(n);
        v
    }
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}
