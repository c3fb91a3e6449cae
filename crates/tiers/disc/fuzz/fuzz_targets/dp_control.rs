//! DP's control lines (crates/tiers/disc/src/control.rs), as a reachable FE or anyone on
//! DP's port may send them: the authentication in front of each line (counter, MAC) and
//! every command's fields (`parse_send` and the rest), the greeting an FE reads, and DP's
//! answers as the FE reads them (`check_answer`). None may panic; a line signed by its
//! sender is accepted once, then refused as a replay; a command accepted once parses the
//! same every time; a command's signature never passes as an answer's.
#![no_main]

use iolab_disc::control::{
    check_answer, parse_command, parse_greeting, parse_send, ControlKey, Refusal, Signer, Verifier,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&which, data)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    let key = ControlKey::from_bytes(*b"fuzz-fuzz-fuzz-!");
    match which % 6 {
        // A whole line as DP reads it: the authentication, then the command.
        0 => {
            let mut v = Verifier::new(key, 7);
            if let Ok(command) = v.check(&text) {
                let _ = parse_command(command);
            }
        }
        // The command alone, and again: the same answer.
        1 => {
            let first = parse_command(&text);
            assert_eq!(first, parse_command(&text));
        }
        // The command signed as the FE signs it: accepted once, then a replay.
        2 => {
            if text.contains(['\r', '\n']) {
                return;
            }
            let s = Signer::new(key.clone(), 9);
            let mut v = Verifier::new(key, 9);
            let line = s.line(&text);
            let line = line.trim_end_matches("\r\n");
            assert_eq!(v.check(line), Ok(&*text));
            assert_eq!(v.check(line), Err(Refusal::Replay));
        }
        // An answer line as the FE reads it.
        4 => {
            let mut v = Verifier::answers(key, 7);
            let _ = check_answer(&mut v, &text);
        }
        // An answer signed by DP: accepted once, then a replay; signed as a command: refused.
        5 => {
            if text.contains(['\r', '\n']) {
                return;
            }
            let line = Signer::answers(key.clone(), 3).line(&text);
            let mut v = Verifier::answers(key.clone(), 3);
            assert_eq!(
                check_answer(&mut v, line.trim_end_matches("\r\n")).ok(),
                Some(text.to_string())
            );
            assert!(check_answer(&mut v, line.trim_end_matches("\r\n")).is_err());
            let command = Signer::new(key.clone(), 3).line(&text);
            let mut fresh = Verifier::answers(key, 3);
            assert!(check_answer(&mut fresh, command.trim_end_matches("\r\n")).is_err());
        }
        _ => {
            let _ = parse_send(&mut text.split_ascii_whitespace());
            let _ = parse_greeting(&text);
        }
    }
});
