//! Random ids and keys (buffer ids, lease and file keys, the agent's id): the kernel's
//! generator, never a seeded one, since they are what makes a reference unforgeable.

pub(crate) fn random_u128() -> u128 {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("getrandom");
    u128::from_le_bytes(b)
}
