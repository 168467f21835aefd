//! The fuzz target's seed corpus of malformed frames (`net/fuzz/malformed-frames/`), through the framing
//! and the decoder as the broker runs them: each one is refused with an error. Among them are requests
//! claiming arrays of 2^31 and 2^32 elements, which must not abort the process.

use std::path::Path;

#[path = "support/corpus.rs"]
mod support;

use shardlog_net::alloc::ReservingAllocator;
use shardlog_net::kafka::{FrameReader, SupportedApis, decode_request};

#[global_allocator]
static ALLOCATOR: ReservingAllocator = ReservingAllocator;

/// How a byte stream ended.
#[derive(Debug)]
enum Outcome {
    /// The framing refused it (length out of bounds).
    BadFrame,
    /// A frame that does not decode as a request we know.
    Refused(String),
    /// A frame that was never completed (the broker closes at end of stream).
    Incomplete,
    /// A request decoded: for a malformed frame, a bug.
    Decoded(String),
}

fn run(bytes: &[u8], apis: &SupportedApis) -> Outcome {
    let mut frames = FrameReader::new(100 << 20);
    frames.extend(bytes);
    match frames.next_frame() {
        Err(_) => Outcome::BadFrame,
        Ok(None) => Outcome::Incomplete,
        Ok(Some(frame)) => match decode_request(frame, apis) {
            Ok(request) => Outcome::Decoded(format!("{:?} v{}", request.api_key, request.version)),
            Err(e) => Outcome::Refused(e.to_string()),
        },
    }
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    support::malformed_frames(Path::new(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn every_malformed_frame_is_refused_by_the_framing_or_the_decoder() {
    let files = corpus();
    assert!(files.len() >= 15, "the corpus is there");
    // The broker's own table and the widest one the codec has: refused either way.
    for apis in [SupportedApis::everything_decodable(), SupportedApis::new(&[])] {
        for (name, bytes) in &files {
            let outcome = run(bytes, &apis);
            if let Outcome::Decoded(request) = &outcome {
                panic!("{name} decoded as {request}");
            }
            if name.contains("truncated") {
                assert!(matches!(outcome, Outcome::Incomplete), "{name}: {outcome:?}");
            } else if name.starts_with("frame-length") {
                assert!(matches!(outcome, Outcome::BadFrame), "{name}: {outcome:?}");
            } else {
                assert!(matches!(outcome, Outcome::Refused(_)), "{name}: {outcome:?}");
            }
        }
    }
}

#[test]
fn huge_array_claims_are_refused_at_the_end_of_the_frame() {
    let apis = SupportedApis::everything_decodable();
    for (name, bytes) in corpus().iter().filter(|(name, _)| name.contains("array-length-2pow")) {
        match run(bytes, &apis) {
            Outcome::Refused(reason) => assert!(reason.contains("does not decode"), "{name}: {reason}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}
