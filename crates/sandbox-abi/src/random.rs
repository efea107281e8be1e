//! Random bytes from the kernel (`getrandom(2)`), for generations,
//! credentials and temporary names: the one source of randomness of the
//! daemon's records, the launcher and the agent, with no generator crate.

use rustix::io::Errno;
use rustix::rand::{getrandom, GetRandomFlags};

/// `N` bytes from the kernel's CSPRNG. Blocks only until the pool is
/// initialised (early boot). Panics if the kernel refuses (no `getrandom`
/// syscall, i.e. Linux < 3.17, which nothing here supports).
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match getrandom(&mut buf[filled..], GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(e) => panic!("getrandom(2) failed: {e}"),
        }
    }
    buf
}

/// A random `u64`.
pub fn u64() -> u64 {
    u64::from_ne_bytes(bytes())
}

/// A random `u128`.
pub fn u128() -> u128 {
    u128::from_ne_bytes(bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fills_every_byte_and_differs_between_calls() {
        let a: [u8; 64] = super::bytes();
        let b: [u8; 64] = super::bytes();
        assert_ne!(a, b);
        // 64 random bytes are all zero with probability 2^-512.
        assert!(a.iter().any(|&x| x != 0));
        assert_ne!(super::u128(), super::u128());
    }
}
