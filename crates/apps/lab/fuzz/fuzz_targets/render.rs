//! `iolab lab --render DIR` on a results.json someone edited, truncated or wrote by hand:
//! it parses or is refused, and whatever parses renders (the seed table rebuilt, the HTML
//! page written) without a panic: no index, division or float formatting trusts the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut r) = serde_json::from_slice::<iolab_lab::results::Results>(data) else {
        return;
    };
    r.seed_vs_iolab = iolab_lab::seedtable::build(&r);
    let page = iolab_lab::report::render(&r);
    assert!(page.starts_with("<!DOCTYPE html>") || page.starts_with("<!doctype html>"));
});
