//! MSE/PE from a peer: the responder fed raw bytes in chunks of every size (the sync search
//! for req1 must stay bounded), and fed a genuine opening and step 3 whose encrypted part is
//! changed by the input (RC4 is a XOR stream, so the responder decrypts the genuine header
//! XOR the input: VC, crypto_provide, PadC and IA lengths of every value); the initiator fed
//! the input as a responder's answer. Never panics; what either holds between feeds stays
//! within MAX_BUFFERED.
#![no_main]

use iolab_seeder::mse::{
    Exchange, Initiator, Policy, Responder, CRYPTO_PLAINTEXT, CRYPTO_RC4, MAX_BUFFERED,
};
use libfuzzer_sys::fuzz_target;

const IH: [u8; 20] = [7; 20];

fn raw(mode: u8, rest: &[u8]) {
    let mut r = Responder::new(Policy::Prefer, vec![[1; 20], IH]);
    for c in rest.chunks((mode as usize >> 2) + 1) {
        match r.feed(c) {
            Err(_) => return,
            Ok(p) if p.done.is_some() => return,
            Ok(_) => assert!(r.buffered() <= MAX_BUFFERED, "{} held", r.buffered()),
        }
    }
}

fn altered_step3(mode: u8, rest: &[u8]) {
    let policy = [Policy::Prefer, Policy::Require, Policy::Off][(mode as usize >> 2) % 3];
    let mut r = Responder::new(policy, vec![IH]);
    let (mut i, opening) = Initiator::new(IH, CRYPTO_RC4 | CRYPTO_PLAINTEXT, b"IA".to_vec());
    let Ok(p2) = r.feed(&opening) else { return };
    let Ok(p3) = i.feed(&p2.send) else { return };
    let mut step3 = p3.send;
    // req1 and req2^req3 (40 bytes) stay; what follows is changed, and more may follow.
    let sealed = step3.len() - 40;
    for (b, x) in step3[40..].iter_mut().zip(rest) {
        *b ^= x;
    }
    step3.extend(rest.iter().skip(sealed));
    if let Ok(p) = r.feed(&step3) {
        if p.done.is_none() {
            assert!(r.buffered() <= MAX_BUFFERED, "{} held", r.buffered());
        }
    }
}

fn answer_to_initiator(rest: &[u8]) {
    let (mut i, _) = Initiator::new(IH, CRYPTO_RC4, Vec::new());
    if let Ok(p) = i.feed(rest) {
        if p.done.is_none() {
            assert!(i.buffered() <= MAX_BUFFERED, "{} held", i.buffered());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode & 3 {
        0 => raw(mode, rest),
        1 | 2 => altered_step3(mode, rest),
        _ => answer_to_initiator(rest),
    }
});
