//! The report folder of a `tps-table` run: `report.md` (the tables, as also printed), `results.csv`,
//! `hdr/*.hlog` (each row's latency histogram, HdrHistogram interval-log format) and charts as SVG and
//! PNG: `tps` (each row's TPS beside the seed's, on a log scale so that rows a thousand times apart are
//! both visible, rows that did not run marked as such) and `latency` (percentile curves with ticks at
//! p50, p90, p99, p99.9 and p99.99). Rows are labelled by what they are, e.g. `S3 acks=1 RF=1`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::serialization::V2Serializer;
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::tps_table::{Outcome, Row, Table};

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
    let svg = out.join("latency.svg");
    draw_latency(SVGBackend::new(&svg, (1100, 560)).into_drawing_area(), &rows)?;
    let png = out.join("latency.png");
    draw_latency(BitMapBackend::new(&png, (1100, 560)).into_drawing_area(), &rows)?;
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
         partition). Cluster: {brokers} broker(s); {flush}. Seed: Kafka 0.10.1 on 4 brokers of 24 cores, no fsync.\n"
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
        for (r, outcome) in &t.rows {
            let (_, mut cells) = seed_columns(t.scenario, r);
            cells.push(r.seed_tps.map_or("n/a".into(), |s| format!("{s:.1}")));
            match outcome {
                Outcome::Measured { tally, .. } => {
                    let tps = outcome.tps().unwrap_or(0.0);
                    cells.push(format!("{tps:.1}"));
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
    }
    out
}

fn csv(tables: &[Table], flush: &str) -> String {
    let mut out = String::from(
        "scenario,partitions,replicas,min_insync_replicas,acks,seed_tps,tps,ratio,p50_ms,p99_ms,p999_ms,max_ms,errors,status,flush\n",
    );
    for t in tables {
        for (r, outcome) in &t.rows {
            let min = r.min_insync.map_or(String::new(), |m| m.to_string());
            let seed = r.seed_tps.map_or(String::new(), |s| format!("{s:.1}"));
            let (tps, ratio, lat, errors, status) = match outcome {
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
                        ratio,
                        lat,
                        tally.errors.values().sum::<u64>().to_string(),
                        "measured".to_string(),
                    )
                }
                Outcome::Needs { brokers } => {
                    (String::new(), String::new(), ",,,".into(), String::new(), format!("needs {brokers} brokers"))
                }
                Outcome::Failed(_) => (String::new(), String::new(), ",,,".into(), String::new(), "failed".into()),
            };
            let _ = writeln!(
                out,
                "{},{},{},{min},{},{seed},{tps},{ratio},{lat},{errors},{status},{}",
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
    let top = rows.iter().map(|(_, r, o)| o.tps().unwrap_or(0.0).max(r.seed_tps.unwrap_or(0.0))).fold(10.0, f64::max);
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption("Messages per second: the seed's Kafka (grey) and shardlog (blue), log scale", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(260)
        .build_cartesian_2d((1f64..top * 3.0).log_scale(), 0f64..n as f64)
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
        let (x, y) = chart.backend_coord(&(1.0, (n - 1 - i) as f64 + 0.5));
        root.draw(&Text::new(label.clone(), (x - 8, y), label_style.clone())).map_err(plot_err)?;
    }
    for (i, (_, r, o)) in rows.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        if let Some(seed) = r.seed_tps {
            let bar = Rectangle::new([(1.0, y + 0.52), (seed, y + 0.9)], RGBColor(160, 160, 160).filled());
            chart.draw_series([bar]).map_err(plot_err)?;
        }
        match (o.tps(), not_run(o)) {
            (Some(ours), _) => {
                let bar = Rectangle::new([(1.0, y + 0.1), (ours.max(1.0), y + 0.48)], BLUE.filled());
                chart.draw_series([bar]).map_err(plot_err)?;
                let text = Text::new(format!("{ours:.0}"), (ours.max(1.0) * 1.1, y + 0.42), ("sans-serif", 12));
                chart.draw_series([text]).map_err(plot_err)?;
            }
            (None, Some(why)) => {
                let text = Text::new(why, (1.2, y + 0.42), ("sans-serif", 13).into_font().color(&RED));
                chart.draw_series([text]).map_err(plot_err)?;
            }
            (None, None) => {}
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Latency against percentile for each acknowledged row. The x axis is in "nines" (-log10 of the
/// fraction above): p50 at 0.3, p90 at 1, p99 at 2, p99.9 at 3, p99.99 at 4; the y axis is logarithmic.
fn draw_latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[(String, &Row, &Outcome)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let quantiles = [0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999];
    let nines = |q: f64| -(1.0 - q).log10();
    let curves: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter_map(|(label, _, o)| match o {
            Outcome::Measured { tally, .. } if !tally.latency_us.is_empty() => Some((
                label.clone(),
                quantiles
                    .iter()
                    .map(|q| (nines(*q), (tally.latency_us.value_at_quantile(*q) as f64 / 1000.0).max(0.001)))
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    let top = curves.iter().flat_map(|(_, c)| c.iter().map(|(_, y)| *y)).fold(0.1, f64::max);
    let bottom = curves.iter().flat_map(|(_, c)| c.iter().map(|(_, y)| *y)).fold(top, f64::min);
    let (low, high) = (bottom / 2.0, top * 2.0);
    let mut chart = ChartBuilder::on(&root)
        .caption("Send-to-acknowledgement latency by percentile (log scale)", ("sans-serif", 20))
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
        .y_label_formatter(&|y| format!("{y}"))
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
        root.draw(&Text::new(name, (px, py + 6), tick_style.clone())).map_err(plot_err)?;
    }
    for (i, (label, points)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if !curves.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
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
    use super::table_cell;

    #[test]
    fn a_multi_line_error_stays_in_one_cell() {
        let cell = table_cell("start the cluster: broker 2 exited\n  listen on 127.0.0.1:5 | in use\n\n");
        assert_eq!(cell, "start the cluster: broker 2 exited /   listen on 127.0.0.1:5 / in use");
    }
}
