//! The campaign's report (`report.md`): the cluster and its settings, the faults, what was acknowledged
//! and lost, the checker's findings, the unavailability after each fault, the verdict and the timeline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use shardlog_bench::faults::check::{Delivery, Event, Verdict};
use shardlog_bench::faults::net;
use shardlog_bench::faults::plan::Fault;

use super::{FaultsArgs, PRODUCERS, SETTINGS, Security, TOPIC};

/// Whether `producer` sends with acks=all.
fn deliveries_all_acks(producer: u32) -> bool {
    PRODUCERS.iter().any(|&(id, delivery)| id == producer && delivery != Delivery::AcksOne)
}

/// Percentile `q` (0..=1) of sorted `values`.
fn percentile(values: &[Duration], q: f64) -> Duration {
    values.get(((values.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn render(
    args: &FaultsArgs,
    seed: u64,
    replicas: i16,
    min_insync: i16,
    faults: &[Fault],
    kills: &BTreeMap<&str, usize>,
    started: &[Duration],
    ended: Duration,
    history: &[(Duration, Event)],
    verdict: &Verdict,
    failures: usize,
    refused: &BTreeMap<(u32, i16), u64>,
    timeline: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Fault campaign, seed {seed}\n");
    let place = if args.no_netns { "on loopback" } else { "each in its own network namespace" };
    let _ = writeln!(
        out,
        "{} brokers {place}, topic `{TOPIC}`: {} partitions, {replicas} replicas, min.insync.replicas={min_insync}; {} faults{}.\n",
        args.brokers,
        args.partitions,
        faults.len(),
        if args.beyond { ", beyond what the topic promises to survive" } else { "" }
    );
    let settings: Vec<String> = SETTINGS.iter().map(|s| s.to_string()).chain(args.settings.iter().cloned()).collect();
    let _ = writeln!(out, "Broker settings: `{}`.\n", settings.join(" "));
    if args.security == Security::SaslSsl {
        let _ = writeln!(
            out,
            "Secured everywhere: clients over SASL_SSL (SCRAM-SHA-512) on the brokers' only listener, replication and the quorum over cluster mTLS, Kafka's StandardAuthorizer on (the campaign's user a super user); certificates and `client.properties` in `certificates/`.\n"
        );
    }
    let _ = writeln!(
        out,
        "A packet-loss fault drops {}% of the broker's packets each way at random (nftables); a slow link is a token bucket of {} each way holding packets up to {} (this kernel has no netem to add a fixed delay); a full disk is the broker's own ext4 filesystem filled to its last block.\n",
        net::LOSS_PERCENT,
        net::SLOW_RATE,
        net::SLOW_QUEUE
    );
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in faults {
        *kinds.entry(f.kind.name()).or_default() += 1;
    }
    let _ = writeln!(out, "| fault | count |\n|---|---|");
    for (kind, count) in &kinds {
        let _ = writeln!(out, "| {kind} | {count} |");
    }
    let roles: Vec<String> = kills.iter().map(|(role, n)| format!("{n} {role}")).collect();
    let _ = writeln!(out, "\nThe brokers killed were, just before (by the metadata): {}.", roles.join(", "));
    let [idempotent, acks_all, acks_one] = verdict.acknowledged;
    let _ = writeln!(
        out,
        "\n| | acknowledged | lost |\n|---|---|---|\n| idempotent, acks=all | {idempotent} | {} |\n| acks=all, retries | {acks_all} | {} |\n| acks=1 (baseline, lossy by design) | {acks_one} | {} |\n",
        verdict.lost.iter().filter(|l| l.acked.tag.producer == PRODUCERS[0].0).count(),
        verdict.lost.iter().filter(|l| l.acked.tag.producer == PRODUCERS[1].0).count(),
        verdict.lost_acks_one,
    );
    let _ = writeln!(
        out,
        "- offsets read and later changed: {}\n- high watermarks gone back: {}\n- replicas differing below the high watermark: {}\n- duplicates from the idempotent producer: {}\n- extra copies from plain retries (at least once, allowed): {}",
        verdict.moved.len(),
        verdict.high_watermark_back.len(),
        verdict.diverged.len(),
        verdict.duplicated_idempotent.len(),
        verdict.duplicated_retries
    );
    for ((producer, code), count) in refused {
        let stopped = if *producer == PRODUCERS[0].0 { " (the idempotent producer stopped: a finding)" } else { "" };
        let _ = writeln!(out, "- producer {producer}: {count} records refused for good with error {code}{stopped}");
    }
    // Unavailability: from a fault's start until every partition has taken an acks=all write again (a
    // partition that never did counts until the workload stopped).
    let mut acks: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for (at, event) in history {
        if let Event::Acked(s) = event
            && deliveries_all_acks(s.tag.producer)
        {
            acks.entry(s.partition).or_default().push(*at);
        }
    }
    let mut waits: Vec<Duration> = started
        .iter()
        .map(|&start| {
            (0..args.partitions as u32)
                .map(|p| {
                    let next = acks.get(&p).and_then(|times| times.iter().find(|&&at| at >= start));
                    next.map_or(ended.saturating_sub(start), |&at| at - start)
                })
                .max()
                .unwrap_or_default()
        })
        .collect();
    waits.sort();
    let _ = writeln!(
        out,
        "- unavailability after a fault (its start until every partition took an acks=all write again; the producers send one record at a time round robin, so one stalled partition holds up the others): p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        percentile(&waits, 0.5).as_secs_f64(),
        percentile(&waits, 0.99).as_secs_f64(),
        waits.last().copied().unwrap_or_default().as_secs_f64()
    );
    let lost = verdict.lost.len() + verdict.moved.len();
    let outcome = match (failures, lost) {
        (0, 0) => "PASSED: no acknowledged record lost".to_string(),
        (0, lost) => format!("PASSED beyond what the topic promises: {lost} losses reported, not failed"),
        (failures, _) => format!("FAILED: {failures} findings"),
    };
    let _ = writeln!(out, "\n**{outcome}**\n");
    for lost in verdict.lost.iter().take(20) {
        let _ = writeln!(out, "- lost: {lost:?}");
    }
    for moved in verdict.moved.iter().take(20) {
        let _ = writeln!(out, "- moved: {moved:?}");
    }
    for back in &verdict.high_watermark_back {
        let _ = writeln!(out, "- high watermark back: {back:?}");
    }
    for diverged in verdict.diverged.iter().take(20) {
        let _ = writeln!(out, "- diverged: {diverged:?}");
    }
    let _ = writeln!(out, "\n## Timeline\n\n```text\n{timeline}```");
    out
}
