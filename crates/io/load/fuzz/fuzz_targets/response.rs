//! The load generator's response parser on any bytes a server may send: no panic, and the
//! same responses (status, where each ends, the final verdict) however the stream is cut into
//! reads, since a real socket cuts it anywhere.
#![no_main]

use iolab_load::response::{Progress, ResponseParser};
use libfuzzer_sys::fuzz_target;

/// What a client sees of one stream: each response's status and the bytes it took, then how
/// the stream ended.
#[derive(Debug, PartialEq)]
struct Seen {
    responses: Vec<(Option<u16>, usize)>,
    end: String,
}

fn parse(stream: &[u8], cuts: &[usize]) -> Seen {
    let mut p = ResponseParser::new();
    let mut seen = Seen {
        responses: Vec::new(),
        end: String::new(),
    };
    let mut taken = 0; // bytes of the current response
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&stream.len())) {
        let mut piece = &stream[start..end.max(start)];
        start = end.max(start);
        while !piece.is_empty() {
            match p.feed(piece) {
                Progress::NeedMore => {
                    taken += piece.len();
                    piece = &[];
                }
                Progress::Done { consumed } => {
                    assert!(
                        consumed <= piece.len(),
                        "consumed {consumed} of {}",
                        piece.len()
                    );
                    let status = p.status();
                    if let Some(s) = status {
                        assert!(
                            (100..=599).contains(&s),
                            "status {s} (RFC 9110 §15: 100..599)"
                        );
                    }
                    seen.responses.push((status, taken + consumed));
                    piece = &piece[consumed..];
                    taken = 0;
                    p.reset();
                }
                Progress::Failed(kind) => {
                    seen.end = format!("failed {kind:?}");
                    return seen;
                }
            }
        }
    }
    seen.end = match p.eof() {
        Ok(()) => format!("eof ok, {} responses", seen.responses.len()),
        Err(kind) => format!("eof {kind:?}"),
    };
    seen
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (knobs, stream) = data.split_at(2);
    // cut points every `step` bytes, shifted by `phase`
    let step = usize::from(knobs[0] % 32) + 1;
    let phase = usize::from(knobs[1]) % step;
    let cuts: Vec<usize> = (phase..stream.len())
        .step_by(step)
        .filter(|&c| c > 0)
        .collect();
    let whole = parse(stream, &[]);
    let cut = parse(stream, &cuts);
    assert_eq!(whole, cut, "cuts every {step} from {phase}");
});
