//! The report folder of a `tps-table` run: `report.md` (the tables, as also printed), `results.csv`,
//! `hdr/*.hlog` (each row's latency histogram, HdrHistogram interval-log format) and charts as SVG and
//! PNG: `tps` (each row's TPS beside the seed's, on a log scale so that rows a thousand times apart are
//! both visible, starting just below the smallest figure so that rows ten times apart look it, rows that
//! did not run marked as such) and `latency` (one panel per scenario, percentile curves with ticks at
//! p50, p90, p99, p99.9 and p99.99). Rows are labelled by what they are, e.g. `S3 acks=1 RF=1`. A row that
//! acknowledged fewer than [`MIN_RECORDS_PER_ROW`] records is marked too short in the tables.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::serialization::V2Serializer;
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::tps_table::{MIN_RECORDS_PER_ROW, Outcome, Row, Table};

/// Where the charts find a font (plotters draws text itself; any of these will do).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

pub fn write(out: &Path, tables: &[Table], flush: &str, brokers: usize) -> Result<()> {
    std::fs::create_dir_all(out.join("hdr")).with_context(|| format!("create {}", out.display()))?;
    let markdown = markdown(tables, flush, brokers);
    print!("{markdown}");
    std::fs::write(out.join("report.md"), &markdown)?;
    std::fs::write(out.join("results.csv"), csv(tables, flush))?;
    write_histograms(out, tables)?;
    register_font()?;
    let rows: Vec<(String, &Row, &Outcome)> =
        tables.iter().flat_map(|t| t.rows.iter().map(|(r, o)| (label(r), r, o))).collect();
    // One band of bars per row.
    let size = (1100, 110 + 34 * rows.len().max(1) as u32);
    let svg = out.join("tps.svg");
    draw_tps(SVGBackend::new(&svg, size).into_drawing_area(), &rows)?;
    let png = out.join("tps.png");
    draw_tps(BitMapBackend::new(&png, size).into_drawing_area(), &rows)?;
    let size = latency_size(&rows);
    let svg = out.join("latency.svg");
    draw_latency(SVGBackend::new(&svg, size).into_drawing_area(), &rows)?;
    let png = out.join("latency.png");
    draw_latency(BitMapBackend::new(&png, size).into_drawing_area(), &rows)?;
    Ok(())
}

/// What a row is, in the terms of its table: `S3 acks=1 RF=1`, `S1 acks=-1 RF=3 min.isr=2 P=12`.
pub fn label(r: &Row) -> String {
    let mut out = format!("S{} acks={} RF={}", r.scenario, acks(r.acks), r.replicas);
    if let Some(m) = r.min_insync {
        let _ = write!(out, " min.isr={m}");
    }
    if r.scenario == 1 || r.scenario == 4 {
        let _ = write!(out, " P={}", r.partitions);
    }
    out
}

/// Why a row has no figure, for the charts.
fn not_run(o: &Outcome) -> Option<String> {
    match o {
        Outcome::Measured { .. } => None,
        Outcome::Needs { brokers } => Some(format!("not run: needs {brokers} brokers")),
        Outcome::Failed(reason) => {
            let short: String = reason.chars().take(70).collect();
            Some(format!("not run: {short}"))
        }
    }
}

fn acks(a: i16) -> &'static str {
    match a {
        0 => "0",
        1 => "1",
        _ => "-1",
    }
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The seed's columns for a scenario, and a row's values in them.
fn seed_columns(scenario: u8, r: &Row) -> (Vec<&'static str>, Vec<String>) {
    let min = r.min_insync.map_or("N/A".to_string(), |m| m.to_string());
    match scenario {
        1 => (
            vec!["acks", "replicas", "min.insync.replicas", "retries"],
            vec![acks(r.acks).into(), r.replicas.to_string(), min, "0".into()],
        ),
        2 => (vec!["replicas", "min.insync.replicas"], vec![r.replicas.to_string(), min]),
        3 => (vec!["replicas", "acks"], vec![r.replicas.to_string(), acks(r.acks).into()]),
        _ => (vec!["partitions"], vec![r.partitions.to_string()]),
    }
}

fn markdown(tables: &[Table], flush: &str, brokers: usize) -> String {
    let mut out = format!(
        "# tps-table\n\nOne producer, 1 KiB messages, sync sends (one message per request, one request in flight per \
         partition). Cluster: {brokers} broker(s); {flush}. Seed: Kafka 0.10.1 on 4 brokers of 24 cores, no fsync. \
         With more than one shard per broker, a one-partition row is served in place or across shards as its \
         connection lands, which can make it several times slower than its neighbours (docs/performance.md).\n"
    );
    for t in tables {
        let _ = write!(out, "\n## {}\n\n", t.title);
        if let Some(text) = &t.text {
            out.push_str(text);
            continue;
        }
        let Some((first, _)) = t.rows.first() else {
            out.push_str("Not run: needs a replicated cluster.\n");
            continue;
        };
        let (columns, _) = seed_columns(t.scenario, first);
        let extra = ["Kafka TPS (seed)", "shardlog TPS", "ratio", "p50 ms", "p99 ms", "p99.9 ms"];
        let header: Vec<&str> = columns.iter().copied().chain(extra).collect();
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        let mut too_short = 0;
        for (r, outcome) in &t.rows {
            let (_, mut cells) = seed_columns(t.scenario, r);
            cells.push(r.seed_tps.map_or("n/a".into(), |s| format!("{s:.1}")));
            match outcome {
                Outcome::Measured { tally, .. } => {
                    let tps = outcome.tps().unwrap_or(0.0);
                    if tally.messages < MIN_RECORDS_PER_ROW {
                        too_short += 1;
                        cells.push(format!("{tps:.1} (too short: {} records)", tally.messages));
                    } else {
                        cells.push(format!("{tps:.1}"));
                    }
                    cells.push(r.seed_tps.map_or("-".into(), |s| format!("{:.2}x", tps / s)));
                    if r.acks == 0 || tally.latency_us.is_empty() {
                        cells.extend(["-".into(), "-".into(), "-".into()]);
                    } else {
                        let h = &tally.latency_us;
                        cells.extend([
                            ms(h.value_at_quantile(0.5)),
                            ms(h.value_at_quantile(0.99)),
                            ms(h.value_at_quantile(0.999)),
                        ]);
                    }
                }
                Outcome::Needs { brokers } => {
                    cells.push(format!("needs {brokers} brokers"));
                    cells.extend(["-".into(), "-".into(), "-".into(), "-".into()]);
                }
                Outcome::Failed(reason) => {
                    cells.push(format!("failed: {}", table_cell(reason)));
                    cells.extend(["-".into(), "-".into(), "-".into(), "-".into()]);
                }
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if too_short > 0 {
            out.push_str(&too_short_note(too_short));
        }
    }
    out
}

/// What the report says under a table with rows that acknowledged too few records to mean anything.
pub fn too_short_note(rows: usize) -> String {
    format!(
        "\n**The run was too short for {rows} row(s)** (marked \"too short\"): each acknowledged fewer than \
         {MIN_RECORDS_PER_ROW} records, so its rate is a handful of round trips and its percentiles a few records. \
         Run again with a longer --duration.\n"
    )
}

fn csv(tables: &[Table], flush: &str) -> String {
    let mut out = String::from(
        "scenario,partitions,replicas,min_insync_replicas,acks,seed_tps,tps,records,ratio,p50_ms,p99_ms,p999_ms,max_ms,errors,status,flush\n",
    );
    for t in tables {
        for (r, outcome) in &t.rows {
            let min = r.min_insync.map_or(String::new(), |m| m.to_string());
            let seed = r.seed_tps.map_or(String::new(), |s| format!("{s:.1}"));
            let (tps, records, ratio, lat, errors, status) = match outcome {
                Outcome::Measured { tally, .. } => {
                    let tps = outcome.tps().unwrap_or(0.0);
                    let ratio = r.seed_tps.map_or(String::new(), |s| format!("{:.3}", tps / s));
                    let h = &tally.latency_us;
                    let lat = if h.is_empty() {
                        ",,,".to_string()
                    } else {
                        format!(
                            "{},{},{},{}",
                            ms(h.value_at_quantile(0.5)),
                            ms(h.value_at_quantile(0.99)),
                            ms(h.value_at_quantile(0.999)),
                            ms(h.max())
                        )
                    };
                    (
                        format!("{tps:.1}"),
                        tally.messages.to_string(),
                        ratio,
                        lat,
                        tally.errors.values().sum::<u64>().to_string(),
                        "measured".to_string(),
                    )
                }
                Outcome::Needs { brokers } => (
                    String::new(),
                    String::new(),
                    String::new(),
                    ",,,".into(),
                    String::new(),
                    format!("needs {brokers} brokers"),
                ),
                Outcome::Failed(_) => {
                    (String::new(), String::new(), String::new(), ",,,".into(), String::new(), "failed".into())
                }
            };
            let _ = writeln!(
                out,
                "{},{},{},{min},{},{seed},{tps},{records},{ratio},{lat},{errors},{status},{}",
                t.scenario,
                r.partitions,
                r.replicas,
                r.acks,
                if flush.contains("interval") { "interval" } else { "always" }
            );
        }
    }
    out
}

fn write_histograms(out: &Path, tables: &[Table]) -> Result<()> {
    for t in tables {
        for (i, (_, outcome)) in t.rows.iter().enumerate() {
            let Outcome::Measured { tally, elapsed } = outcome else { continue };
            if tally.latency_us.is_empty() {
                continue;
            }
            let mut file = std::fs::File::create(out.join("hdr").join(format!("s{}r{}.hlog", t.scenario, i + 1)))?;
            let mut serializer = V2Serializer::new();
            let mut log = IntervalLogWriterBuilder::new()
                .add_comment("send-to-acknowledgement latency in microseconds")
                .with_base_time(UNIX_EPOCH)
                .begin_log_with(&mut file, &mut serializer)?;
            log.write_histogram(&tally.latency_us, Duration::ZERO, *elapsed, None)
                .map_err(|e| anyhow!("write histogram log: {e:?}"))?;
        }
    }
    Ok(())
}

pub(crate) fn register_font() -> Result<()> {
    let Some(bytes) = FONT_PATHS.iter().find_map(|p| std::fs::read(p).ok()) else {
        bail!("no font for the charts: install fonts-dejavu-core (looked in {FONT_PATHS:?})");
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("the font does not load"))?;
    Ok(())
}

pub(crate) fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("draw chart: {e:?}")
}

/// Each row's TPS beside the seed's, one band per row, on a log scale; rows without a figure say why.
fn draw_tps<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[(String, &Row, &Outcome)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let figures = || rows.iter().flat_map(|(_, r, o)| [o.tps(), r.seed_tps]).flatten().filter(|v| *v > 0.0);
    let top = figures().fold(10.0, f64::max);
    // The axis starts below the smallest figure, not at 1: from 1, rows ten times apart would look alike.
    let low = round_down(figures().fold(top, f64::min) / 1.5);
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption("Messages per second: the seed's Kafka (grey) and shardlog (blue), log scale", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(260)
        .build_cartesian_2d((low..top * 3.0).log_scale(), 0f64..n as f64)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("messages/s")
        .draw()
        .map_err(plot_err)?;
    // Row i's band is [n - i - 1, n - i), so the first row is on top; its label sits left of the band.
    let label_style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, (label, _, _)) in rows.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(low, (n - 1 - i) as f64 + 0.5));
        root.draw(&Text::new(label.clone(), (x - 8, y), label_style.clone())).map_err(plot_err)?;
    }
    for (i, (_, r, o)) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        if let Some(seed) = r.seed_tps {
            let bar = Rectangle::new([(low, y + 0.52), (seed, y + 0.9)], RGBColor(160, 160, 160).filled());
            chart.draw_series([bar]).map_err(plot_err)?;
        }
        match (o.tps(), not_run(o)) {
            (Some(ours), _) => {
                let bar = Rectangle::new([(low, y + 0.1), (ours.max(low), y + 0.48)], BLUE.filled());
                chart.draw_series([bar]).map_err(plot_err)?;
                let figure = match o {
                    Outcome::Measured { tally, .. } if tally.messages < MIN_RECORDS_PER_ROW => {
                        format!("{ours:.0} (too short: {} records)", tally.messages)
                    }
                    _ => format!("{ours:.0}"),
                };
                let text = Text::new(figure, (ours.max(low) * 1.05, y + 0.42), ("sans-serif", 12));
                chart.draw_series([text]).map_err(plot_err)?;
            }
            (None, Some(why)) => {
                let text = Text::new(why, (low * 1.05, y + 0.42), ("sans-serif", 13).into_font().color(&RED));
                chart.draw_series([text]).map_err(plot_err)?;
            }
            (None, None) => {}
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// The largest 1, 2 or 5 times a power of ten at or below `v`: where a log axis below `v` starts.
fn round_down(v: f64) -> f64 {
    let decade = 10f64.powf(v.max(1e-9).log10().floor());
    [5.0, 2.0, 1.0].into_iter().map(|m| m * decade).find(|x| *x <= v).unwrap_or(decade)
}

/// An axis value with as many decimals as it needs: 0.05, 0.5, 5, 50.
fn axis_value(v: f64) -> String {
    let decimals = if v >= 10.0 { 0 } else { (1.0 - v.log10().floor()).clamp(1.0, 4.0) as usize };
    let text = format!("{v:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

/// Colours told apart at a glance (Tableau 10): a panel has at most nine curves.
const CURVE_COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The size of one scenario's latency panel.
const LATENCY_PANEL: (u32, u32) = (1100, 560);
/// The width of a panel's legend, right of its plot.
const LEGEND_WIDTH: u32 = 290;

/// One latency curve: a row's label and its (nines, ms) points.
type Curve = (String, Vec<(f64, f64)>);

/// The latency chart's panels: one per scenario with acknowledged rows (at least one panel).
fn latency_panels(rows: &[(String, &Row, &Outcome)]) -> Vec<(u8, Vec<Curve>)> {
    let quantiles = [0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999];
    let mut panels: Vec<(u8, Vec<Curve>)> = Vec::new();
    for (label, r, o) in rows {
        let Outcome::Measured { tally, .. } = o else { continue };
        if tally.latency_us.is_empty() {
            continue;
        }
        let points =
            quantiles.iter().map(|q| (nines(*q), (tally.latency_us.value_at_quantile(*q) as f64 / 1000.0).max(0.001)));
        let curve = (label.clone(), points.collect());
        match panels.iter_mut().find(|(s, _)| *s == r.scenario) {
            Some((_, curves)) => curves.push(curve),
            None => panels.push((r.scenario, vec![curve])),
        }
    }
    if panels.is_empty() {
        panels.push((0, Vec::new()));
    }
    panels
}

/// Percentile `q` in "nines": -log10 of the fraction above it.
fn nines(q: f64) -> f64 {
    -(1.0 - q).log10()
}

/// The latency chart's size: its panels one above the other.
fn latency_size(rows: &[(String, &Row, &Outcome)]) -> (u32, u32) {
    (LATENCY_PANEL.0, LATENCY_PANEL.1 * latency_panels(rows).len() as u32)
}

/// Latency against percentile for each acknowledged row, one panel per scenario (its rows' curves in
/// colours told apart, its legend beside the plot, not over it). The x axis is in "nines" (-log10 of the
/// fraction above): p50 at 0.3, p90 at 1, p99 at 2, p99.9 at 3, p99.99 at 4; the y axis is logarithmic,
/// from just below the panel's fastest figure to just above its slowest.
fn draw_latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[(String, &Row, &Outcome)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = latency_panels(rows);
    for ((scenario, curves), area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        let caption = match scenario {
            0 => "Send-to-acknowledgement latency by percentile (log scale)".to_string(),
            s => format!("Scenario {s}: send-to-acknowledgement latency by percentile (log scale)"),
        };
        draw_latency_panel(&area, &caption, curves)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

fn draw_latency_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, caption: &str, curves: &[Curve]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let values = || curves.iter().flat_map(|(_, c)| c.iter().map(|(_, y)| *y));
    let top = values().fold(0.1, f64::max);
    let (low, high) = (round_down(values().fold(top, f64::min) / 1.2), top * 1.5);
    let area = area.titled(caption, ("sans-serif", 20)).map_err(plot_err)?;
    let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0 - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.25f64..4.1, (low..high).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc("percentile")
        .y_label_formatter(&|y| axis_value(*y))
        .y_desc("ms")
        .draw()
        .map_err(plot_err)?;
    // Ticks and grid lines at the percentiles people quote.
    let tick_style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (tick, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9"), (0.9999, "p99.99")] {
        let x = nines(tick);
        let grid = LineSeries::new([(x, low), (x, high)], RGBColor(220, 220, 220).stroke_width(1));
        chart.draw_series(grid).map_err(plot_err)?;
        let (px, py) = chart.backend_coord(&(x, low));
        let (ox, oy) = plot.get_base_pixel();
        plot.draw(&Text::new(name, (px - ox, py - oy + 6), tick_style.clone())).map_err(plot_err)?;
    }
    // The legend, beside the plot: one line per curve, in the curve's colour.
    let label_style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, points)) in curves.iter().enumerate() {
        let colour = CURVE_COLOURS[i % CURVE_COLOURS.len()];
        chart.draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2))).map_err(plot_err)?;
        let y = 20 + 22 * i as i32;
        legend.draw(&PathElement::new([(4, y), (28, y)], colour.stroke_width(3))).map_err(plot_err)?;
        legend.draw(&Text::new(label.clone(), (34, y), label_style.clone())).map_err(plot_err)?;
    }
    Ok(())
}

/// `text` as one Markdown table cell: a `|` would start another column and a line break end the row
/// (a failed start's error quotes the broker's log, several lines).
pub fn table_cell(text: &str) -> String {
    text.split('\n')
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" / ")
        .replace('|', "/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Tally;
    use crate::tps_table::scenario_rows;

    /// A measured row: `records` sent over a second and, for acks other than 0, their latencies from
    /// `fastest_us` up to `slowest_ms` (most of them near the fastest, as real ones are).
    fn measured(r: &Row, records: u64, fastest_us: u64, slowest_ms: u64) -> Outcome {
        let mut tally = Tally { messages: records, bytes: records * 1024, ..Tally::default() };
        if r.acks != 0 {
            let ratio = (slowest_ms * 1000) as f64 / fastest_us as f64;
            for i in 0..records {
                let us = fastest_us as f64 * ratio.powf((i as f64 / records as f64).powi(4));
                tally.record_latency(Duration::from_micros(us as u64), 1);
            }
        }
        Outcome::Measured { tally, elapsed: Duration::from_secs(1) }
    }

    #[test]
    fn every_scenario_gets_a_latency_panel_of_its_own_and_short_rows_are_marked() {
        let tables: Vec<Table> = (1..=4)
            .map(|scenario| {
                let rows = scenario_rows(scenario)
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| {
                        // Scenario 2's rows a hundred times faster than the others; one row too short.
                        let fastest_us = if scenario == 2 { 20 } else { 2_000 + 300 * i as u64 };
                        let records = if scenario == 4 && i == 0 { 30 } else { 5_000 };
                        (r, measured(&r, records, fastest_us, 80))
                    })
                    .collect();
                Table { scenario, title: format!("Scenario {scenario}"), rows, text: None }
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &tables, "acknowledged = fdatasync'ed (--flush always)", 4).unwrap();

        let png = image::open(dir.path().join("latency.png")).unwrap();
        assert_eq!((png.width(), png.height()), (LATENCY_PANEL.0, 4 * LATENCY_PANEL.1), "four panels");
        let svg = std::fs::read_to_string(dir.path().join("latency.svg")).unwrap();
        let lines: Vec<&str> = svg.lines().map(str::trim).collect();
        for scenario in 1..=4 {
            let caption = format!("Scenario {scenario}: send-to-acknowledgement latency by percentile (log scale)");
            assert!(lines.contains(&caption.as_str()), "no panel for scenario {scenario}");
        }
        // Every acknowledged row's curve is in the legend once (acks=0 rows have no latency).
        for (r, _) in tables.iter().flat_map(|t| &t.rows).filter(|(r, _)| r.acks != 0) {
            let label = label(r);
            assert_eq!(lines.iter().filter(|l| **l == label).count(), 1, "{label}");
        }
        // Scenario 2's panel reaches down to its 0.02 ms; the others start near their 2 ms.
        let two = latency_panels(&tables[1].rows.iter().map(|(r, o)| (label(r), r, o)).collect::<Vec<_>>());
        let fastest = two[0].1.iter().flat_map(|(_, c)| c.iter().map(|(_, y)| *y)).fold(f64::MAX, f64::min);
        assert!(fastest < 0.05, "{fastest}");

        let report = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
        assert!(report.contains("(too short: 30 records)"), "{report}");
        assert!(report.contains("**The run was too short for 1 row(s)**"), "{report}");
        assert_eq!(report.matches("too short:").count(), 1, "only the short row is marked: {report}");
        let tps = std::fs::read_to_string(dir.path().join("tps.svg")).unwrap();
        assert!(tps.contains("30 (too short: 30 records)"), "the chart marks the short row too");
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        assert!(csv.lines().next().unwrap().contains(",tps,records,"), "{csv}");
    }

    #[test]
    fn the_tps_axis_starts_just_below_the_smallest_figure() {
        assert_eq!(round_down(36.0 / 1.5), 20.0);
        assert_eq!(round_down(4365.0 / 1.5), 2000.0);
        assert_eq!(round_down(600.0), 500.0);
        assert_eq!(round_down(0.013), 0.01);
        assert_eq!(axis_value(0.05), "0.05");
        assert_eq!(axis_value(2.0), "2");
        assert_eq!(axis_value(500.0), "500");
    }

    #[test]
    fn a_multi_line_error_stays_in_one_cell() {
        let cell = table_cell("start the cluster: broker 2 exited\n  listen on 127.0.0.1:5 | in use\n\n");
        assert_eq!(cell, "start the cluster: broker 2 exited /   listen on 127.0.0.1:5 / in use");
    }
}
