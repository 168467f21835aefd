//! How shardlog's command-line tools (`shardlog`, `shardlog-bench`) end on an error: with its message and
//! what caused it, as anyhow lays them out, but never the backtrace anyhow captures when `RUST_BACKTRACE`
//! is set. An error that reaches a tool's `main` is an expected one (a refused setting, an unknown topic,
//! a port in use): where the code was is of no use to the user. A bug panics, and a panic still prints
//! its backtrace.

/// The text printed for `error`: `Error: <message>`, then its causes.
pub fn report(error: &anyhow::Error) -> String {
    let mut out = format!("Error: {error}");
    let causes: Vec<String> = error.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        out.push_str("\n\nCaused by:");
    }
    for (i, cause) in causes.iter().enumerate() {
        match causes.len() {
            1 => out.push_str(&format!("\n    {cause}")),
            _ => out.push_str(&format!("\n    {i}: {cause}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_prints_its_message_and_causes_and_no_backtrace() {
        let error = anyhow::anyhow!("disk gone").context("open logs").context("start");
        assert_eq!(report(&error), "Error: start\n\nCaused by:\n    0: open logs\n    1: disk gone");
        assert_eq!(report(&anyhow::anyhow!("no such topic")), "Error: no such topic");
    }
}
