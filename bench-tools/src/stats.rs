//! What a load run measured: counts, bytes, latency (hdrhistogram, microseconds) and errors by Kafka
//! error code, merged from every sending thread and printed the same way by every command.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

/// Results of one sending or receiving thread, merged into the run's.
#[derive(Debug, Clone)]
pub struct Tally {
    pub messages: u64,
    pub bytes: u64,
    /// Microseconds, from send to acknowledgement (or from creation to consumption).
    pub latency_us: Histogram<u64>,
    /// Messages refused, by Kafka error code.
    pub errors: BTreeMap<i16, u64>,
    /// Messages sent again after a retriable error, by the error's code (each retry counted).
    pub retried: BTreeMap<i16, u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            messages: 0,
            bytes: 0,
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            errors: BTreeMap::new(),
            retried: BTreeMap::new(),
        }
    }
}

impl Tally {
    pub fn merge(&mut self, other: &Tally) {
        self.messages += other.messages;
        self.bytes += other.bytes;
        self.latency_us.add(&other.latency_us).expect("histograms with the same bounds");
        for (code, n) in &other.errors {
            *self.errors.entry(*code).or_default() += n;
        }
        for (code, n) in &other.retried {
            *self.retried.entry(*code).or_default() += n;
        }
    }

    /// `count` messages that took `latency` each.
    pub fn record_latency(&mut self, latency: Duration, count: u64) {
        let us = (latency.as_micros() as u64).clamp(1, self.latency_us.high());
        self.latency_us.record_n(us, count).expect("value within bounds");
    }

    pub fn messages_per_sec(&self, elapsed: Duration) -> f64 {
        self.messages as f64 / elapsed.as_secs_f64().max(1e-9)
    }

    pub fn mb_per_sec(&self, elapsed: Duration) -> f64 {
        self.bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)
    }

    /// The summary lines every command prints. `latency_label` says what the latency measures (or
    /// `None` when there is none, as for acks=0).
    pub fn report(&self, elapsed: Duration, latency_label: Option<&str>) -> String {
        let mut out = format!(
            "{} messages in {:.2} s: {:.0} msg/s, {:.1} MB/s\n",
            self.messages,
            elapsed.as_secs_f64(),
            self.messages_per_sec(elapsed),
            self.mb_per_sec(elapsed)
        );
        match latency_label {
            Some(label) if !self.latency_us.is_empty() => {
                let h = &self.latency_us;
                out.push_str(&format!(
                    "{label} (ms): p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n",
                    h.value_at_quantile(0.5) as f64 / 1000.0,
                    h.value_at_quantile(0.99) as f64 / 1000.0,
                    h.value_at_quantile(0.999) as f64 / 1000.0,
                    h.max() as f64 / 1000.0
                ));
            }
            _ => {}
        }
        // Kafka's names, as its clients print them: NOT_LEADER_OR_FOLLOWER.
        let name = shardlog_broker::metrics::error_name;
        for (code, n) in &self.retried {
            out.push_str(&format!("retried: {n} x {} (code {code})\n", name(*code)));
        }
        for (code, n) in &self.errors {
            out.push_str(&format!("errors: {n} x {} (code {code})\n", name(*code)));
        }
        out
    }
}

/// A progress bar on stderr (drawn only on a terminal) while a run goes: messages against `--messages`,
/// or seconds against `--duration`. Cleared when dropped.
#[derive(Debug)]
pub struct Progress {
    bar: indicatif::ProgressBar,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub fn start(
        messages: Option<u64>,
        duration: Option<Duration>,
        done: impl Fn() -> u64 + Send + 'static,
    ) -> Progress {
        let (len, unit) = match (messages, duration) {
            (Some(m), _) => (m, "messages"),
            (None, Some(d)) => (d.as_secs().max(1), "s"),
            (None, None) => (0, "messages"),
        };
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {unit}"
            ))
            .expect("a valid template"),
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let (bar, stop) = (bar.clone(), stop.clone());
            let started = std::time::Instant::now();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    bar.set_position(if messages.is_some() { done() } else { started.elapsed().as_secs() });
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Progress { bar, stop, ticker: Some(ticker) }
    }
}

impl Progress {
    /// A line on stderr, above the bar when there is one.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
        self.bar.finish_and_clear();
    }
}

/// Parses `30s`, `500ms`, `2m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s or m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn errors_are_reported_by_kafkas_names() {
        let mut tally = Tally::default();
        tally.errors.insert(6, 3);
        tally.retried.insert(19, 2);
        let report = tally.report(std::time::Duration::from_secs(1), None);
        assert!(report.contains("errors: 3 x NOT_LEADER_OR_FOLLOWER (code 6)"), "{report}");
        assert!(report.contains("retried: 2 x NOT_ENOUGH_REPLICAS (code 19)"), "{report}");
    }
}
