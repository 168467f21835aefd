//! Any byte stream a client can send, through the framing and the request decoder as the broker runs
//! them: every frame either decodes or is refused with an error; nothing panics or aborts.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardlog_net::alloc::ReservingAllocator;
use shardlog_net::kafka::{FrameReader, SupportedApis, decode_request};

// As in the broker: a request claiming a huge array reserves address space instead of aborting.
#[global_allocator]
static ALLOCATOR: ReservingAllocator = ReservingAllocator;

fuzz_target!(|data: &[u8]| {
    let apis = SupportedApis::everything_decodable();
    let mut frames = FrameReader::new(1 << 20);
    // Arrives in two reads, so frames split across reads are part of what is fuzzed.
    let (first, second) = data.split_at(data.len() / 2);
    for chunk in [first, second] {
        frames.extend(chunk);
        loop {
            match frames.next_frame() {
                Ok(Some(frame)) => {
                    let _ = decode_request(frame, &apis);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
